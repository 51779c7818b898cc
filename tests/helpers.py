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


def tree_digest(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Everything under `root` but `skip` (and the base-model cache): each path's kind, mode and
    content hash (a link: its target). Compared before and after a hostile case: nothing outside the
    run folder may be created, deleted or changed."""
    import hashlib

    out = {}
    for p in sorted(root.rglob("*")):
        if (skip is not None and (p == skip or skip in p.parents)) or ".cache" in p.relative_to(root).parts:
            continue
        if p.is_symlink():
            out[str(p)] = f"link {os.readlink(p)}"
        elif p.is_dir():
            out[str(p)] = f"dir {p.stat().st_mode:o}"
        else:
            out[str(p)] = f"file {p.stat().st_mode:o} {hashlib.sha256(p.read_bytes()).hexdigest()}"
    return out


def run_hostile(argv: list[str], root: Path, capsys, skip: Path | None = None) -> tuple[int, list[str]]:
    """Run `compressor ARGV` in this process; return its exit code and stderr's lines other than
    warnings, after checking that nothing under `root` but `skip` changed and no code ran."""
    from compressor.run.cli import main

    before = tree_digest(root, skip)
    code = main(argv)
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("warning: ")]
    assert tree_digest(root, skip) == before, "something outside the run folder changed"
    assert not (root / "PWNED").exists(), "an input ran code"
    return code, err
