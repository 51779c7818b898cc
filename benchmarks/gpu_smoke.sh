#!/usr/bin/env bash
# GPU smoke check (when a CUDA device is present): the default recipe with device cuda and bf16
# autocast, then the Hydra speed table on the GPU in fp32 and bf16. About 5 minutes on one H200.
#   bash benchmarks/gpu_smoke.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/gpu_smoke}"
mkdir -p "$out"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
python -m compressor apply recipes/vit_hydra.yaml --out "$out/recipe" --overwrite --quiet \
    --set device=cuda --set precision=bf16 | tee "$out/recipe.log"
python benchmarks/hydra_speed.py --device cuda --dtype fp32 bf16 --batches 1 64 256 --repeats 10 \
    | tee "$out/hydra_speed_cuda.md"
