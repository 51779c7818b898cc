"""torch.distributed: 2 CPU processes (gloo, loopback) compute what one process computes."""

import copy
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import Subset, TensorDataset

from compressor.data import batches, digits_bundle
from compressor.families import family_of
from compressor.training.config import TrainConfig
from compressor.training.loop import train
from compressor.uq.evaluate import evaluate_model
from compressor.uq.inference import predict
from mergers.hydra import HydraMerger
from pruners import GradientFreePruner, TaylorPruner
from pruners.taylor import taylor_scores

from .conftest import labelled_batches, make_vit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def compute_everything() -> dict:
    """Head scores, masks, metrics and a short fine-tune, the same code in 1 or N processes.

    Every size is chosen so that the DistributedSampler pads: 45 calibration samples in global
    batches of 16, 71 training samples, 101-sample evaluation batches.
    """
    torch.manual_seed(0)
    vit = make_vit("tiny_cls")
    adapter = family_of(vit)
    x, y = (torch.cat(t) for t in zip(*labelled_batches(3, batch=15)))
    calib = batches(TensorDataset(x, y), 16)  # this rank's shards (local batch 8 on 2 ranks)
    gf = GradientFreePruner(members=1, keep_heads=2, diversity="none")
    gf_masks = gf.prune(adapter, calib, calib)
    taylor = TaylorPruner(members=3, keep_ratio=0.5, seed=3, diversity="jitter")
    t_masks = taylor.prune(adapter, calib)
    # bootstrap resamples each rank's shard: not the one-process resample, but the same masks on every rank
    boot_masks = TaylorPruner(members=3, keep_ratio=0.5, seed=3, diversity="bootstrap").prune(adapter, calib)
    data = digits_bundle()
    metrics = evaluate_model(vit, data, batch_size=101)
    probs, _, labels = predict(vit, Subset(data.test, range(37)), batch_size=8)  # gathered in dataset order
    tuned = copy.deepcopy(vit)
    history = train(
        tuned,
        Subset(data.train, range(71)),
        Subset(data.val, range(41)),
        TrainConfig(steps=4, batch_size=32, warmup_steps=1, eval_every=2),
        desc="ddp",
    )
    hydra = HydraMerger(mlp="pruned").merge(vit, t_masks, calibration=[b[0] for b in calib])
    train(hydra, Subset(data.train, range(71)), None, TrainConfig(steps=2, batch_size=32, warmup_steps=1), desc="ddp")
    return {
        "hydra_weights": {k: v.clone() for k, v in hydra.state_dict().items()},
        "calib_samples": sum(len(b[1]) for b in calib),
        "taylor": [s.tolist() for s in taylor_scores(adapter, calib)],
        "gf_scores": [s.tolist() for s in gf.last_scores[0]],
        "gf_masks": [m.to_dict() for m in gf_masks],
        "taylor_masks": [m.to_dict() for m in t_masks],
        "bootstrap_masks": [m.to_dict() for m in boot_masks],
        "metrics": metrics,
        "probs": probs,
        "labels": labels,
        "history": {"loss": history["loss"], "val_nll": history["val_nll"]},
        "weights": {k: v.clone() for k, v in tuned.state_dict().items()},
    }


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = compute_everything()
        torch.save(result, f"{out}.rank{rank}")
    finally:
        dist.destroy_process_group()


def _close(a, b, path=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=path)
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6), path
    else:
        assert a == b, path


def test_sampler_shards_are_disjoint_and_cover_the_batch(monkeypatch):
    """Rank r's local batches, taken together, are exactly the one-process global batches."""
    import compressor.core.distributed as d

    ds = TensorDataset(torch.arange(45))
    single = [b[0].tolist() for b in batches(ds, 16)]
    shards = []
    for r in range(2):
        monkeypatch.setattr(d, "is_distributed", lambda: True)
        monkeypatch.setattr(d, "world_size", lambda: 2)
        monkeypatch.setattr(d, "rank", lambda r=r: r)
        shards.append([b[0].tolist() for b in batches(ds, 16)])
    monkeypatch.undo()
    assert [len(b) for b in shards[0]] == [8, 8, 7] and [len(b) for b in shards[1]] == [8, 8, 6]
    for k, global_batch in enumerate(single):
        assert sorted(shards[0][k] + shards[1][k]) == global_batch


def test_two_gloo_processes_match_one(tmp_path):
    out = str(tmp_path / "result")
    mp.spawn(_worker, args=(2, free_port(), out), nprocs=2, join=True)
    rank0, rank1 = (torch.load(f"{out}.rank{r}", weights_only=True) for r in range(2))
    assert rank0["calib_samples"] + rank1["calib_samples"] == 45, "each rank holds its own shard"
    for key in ("taylor_masks", "gf_masks", "bootstrap_masks"):
        assert rank0[key] == rank1[key], f"{key}: every rank must get the same masks"
    single = compute_everything()
    assert not torch.equal(single["weights"]["head.weight"], make_vit("tiny_cls").head.weight), "it trained"
    per_rank = ("calib_samples", "bootstrap_masks")  # by design not the one-process values
    expected = {k: v for k, v in single.items() if k not in per_rank}
    for result in (rank0, rank1):
        _close({k: v for k, v in result.items() if k not in per_rank}, expected)


def test_compressor_apply_under_torchrun(tmp_path):
    """`torchrun --nproc_per_node 2 -m compressor apply`: one set of outputs, same metrics as 1 process."""
    import json
    import subprocess
    import sys

    from .helpers import ROOT, SMALL, run_cli

    args = [
        "apply",
        str(ROOT / "recipes" / "vit_prune.yaml"),
        *SMALL,
        "--set",
        "steps.2.finetune.steps=3",
        "--set",
        "model.train_base.cache=false",
    ]
    single = run_cli([*args, "--out", str(tmp_path / "one")], tmp_path)
    assert single.returncode == 0, single.stderr[-2000:]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "compressor",
        *args,
        "--out",
        str(tmp_path / "two"),
    ]
    multi = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert multi.returncode == 0, multi.stderr[-3000:]
    assert multi.stdout.count("done in") == 1, "only rank 0 reports and writes"
    a = json.loads((tmp_path / "one" / "metrics.json").read_text())["summary"]
    b = json.loads((tmp_path / "two" / "metrics.json").read_text())["summary"]
    for model in a:
        for key in ("accuracy", "nll", "ece", "brier", "auroc_msp", "fpr95_msp"):
            assert b[model][key] == pytest.approx(a[model][key], rel=1e-3, abs=1e-4), (model, key)
    assert json.loads((tmp_path / "one" / "masks.json").read_text()) == json.loads(
        (tmp_path / "two" / "masks.json").read_text()
    )
