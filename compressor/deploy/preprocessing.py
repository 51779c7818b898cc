"""What an export's recorded preprocessing may say, checked on load before any input is read.

An image model records timm's data config (input size, interpolation, mean, std, crop); a text
model records its tokenizer (always the export's own copy, `tokenizer/`) and a maximum length.
Every number is bounded, so that an edited config.json cannot make `predict` allocate huge inputs,
divide by zero, or read a tokenizer from elsewhere.
"""

from __future__ import annotations

import math

from compressor.core.errors import ExportError
from compressor.core.schema import Field, validate_mapping

MAX_SIDE, MAX_TOKENS = 4096, 8192
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming", "random")
CROP_MODES = ("center", "squash", "border")


def _finite_list(length: int, positive: bool = False) -> callable:
    def check(v: list) -> str | None:
        ok = len(v) == length and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and (x > 0 or not positive)
            for x in v
        )
        return None if ok else f"{length} finite{' positive' if positive else ''} numbers (one per input channel)"

    return check


def _input_size(v: list) -> str | None:
    ints = all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    ok = len(v) == 3 and ints and v[0] in (1, 3) and all(1 <= x <= MAX_SIDE for x in v[1:])
    return None if ok else f"[channels (1 or 3), height, width] with sides in 1..{MAX_SIDE}"


def _crop_pct(v: object) -> str | None:
    ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and 0.05 <= v <= 1.0)
    return None if ok else "a number in [0.05, 1]"


TEXT_SCHEMA = {
    "kind": Field((str,), required=True),
    "tokenizer": Field((str,), required=True, choices=("tokenizer",), doc="the export's own tokenizer folder"),
    "max_length": Field(
        (int,), required=True, check=lambda v: None if 1 <= v <= MAX_TOKENS else f"an integer in 1..{MAX_TOKENS}"
    ),
}


def check_preprocessing(prep: object, where: str) -> dict | None:
    """The recorded preprocessing, checked (None when the export records none); ExportError naming
    `where` (config.json) and the key otherwise."""
    if prep is None:
        return None
    if not isinstance(prep, dict) or prep.get("kind") not in ("image", "text"):
        raise ExportError(f"{where}: preprocessing.kind: expected 'image' or 'text'")
    if prep["kind"] == "text":
        return validate_mapping(where, "preprocessing", prep, TEXT_SCHEMA, error=ExportError)
    size = prep.get("input_size")
    channels = size[0] if isinstance(size, list) and size and size[0] in (1, 3) else 3
    schema = {
        "kind": Field((str,), required=True),
        "input_size": Field((list,), required=True, check=_input_size),
        "interpolation": Field((str,), "bilinear", choices=INTERPOLATIONS),
        "mean": Field((list,), required=True, check=_finite_list(channels)),
        "std": Field((list,), required=True, check=_finite_list(channels, positive=True)),
        "crop_pct": Field((int, float, type(None)), None, check=_crop_pct),
        "crop_mode": Field((str,), "center", choices=CROP_MODES),
    }
    return validate_mapping(where, "preprocessing", prep, schema, error=ExportError)
