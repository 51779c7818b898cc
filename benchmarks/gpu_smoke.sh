#!/usr/bin/env bash
# GPU check in one short script (issue 43; about 8 minutes on one H100/H200):
#  1. the default recipe on CUDA in fp32 and in bf16 (bf16 should be within 1 point of fp32's
#     accuracy and 0.01 of its OOD AUROC, base and Hydra),
#  2. one pretrained recipe (MiniLM topics, the paper's merge) in bf16 on CUDA,
#  3. the Hydra speed table on the GPU: batch 1, 64, 256, fp32 and bf16, single, Deep Ensemble,
#     pruned, average, average with a shared trunk (results/hydra_speed.json, entry 'cuda').
#   bash benchmarks/gpu_smoke.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/gpu_smoke}"
mkdir -p "$out"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
for precision in fp32 bf16; do
    python -m compressor apply recipes/vit_hydra.yaml --out "$out/default_$precision" --overwrite --quiet \
        --set device=cuda --set precision=$precision | tee "$out/default_$precision.log"
done
python -m compressor apply recipes/bert_hydra_topics.yaml --out "$out/topics_bf16" --overwrite --quiet \
    --set device=cuda --set precision=bf16 | tee "$out/topics_bf16.log"
python benchmarks/hydra_speed.py --device cuda --dtype fp32 bf16 --batches 1 64 256 --repeats 10 --no-memory \
    | tee "$out/hydra_speed_cuda.md"
python - "$out" <<'PY'
import json, sys
for run in ("default_fp32", "default_bf16", "topics_bf16"):
    summary = json.load(open(f"{sys.argv[1]}/{run}/metrics.json"))["summary"]
    for name in ("base", "hydra"):
        m = summary[name]
        print(run, name, "acc", round(m["accuracy"], 3), "NLL", round(m["nll"], 3), "AUROC", round(m.get("auroc_msp", float("nan")), 3))
PY
