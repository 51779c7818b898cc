"""Running the real `compressor` command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# a CI-sized version of the default recipes: a smaller ViT, a few training steps
SMALL = [
    "--set",
    "model.kwargs.embed_dim=48",
    "--set",
    "model.kwargs.depth=2",
    "--set",
    "model.kwargs.num_heads=4",
    "--set",
    "model.train_base.steps=12",
    "--set",
    "model.train_base.eval_every=6",
    "--set",
    "data.calibration_samples=64",
]


def run_cli(args: list[str], cwd: Path, extra_path: list[Path] = (), timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in extra_path] + [env.get("PYTHONPATH", "")])
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "compressor", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
