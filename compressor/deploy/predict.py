"""Per-sample predictions with uncertainty on new inputs, from an export: `compressor predict`.

Inputs: for image models a folder of images (searched recursively) or a text file listing image
paths; for text models a text file (one sentence per line) or JSONL (a "text" field per line).
They are turned into model inputs by the export's recorded preprocessing (a timm data config,
or the export's tokenizer). Each sample gets the predicted class and its probability, the top-k,
the max-softmax probability and the entropy, and for ensembles the mutual information, the share
of members that disagree with the ensemble and every member's prediction; `ood` is true when the
export's stored threshold (set by the calibrate step) flags the sample; `prediction_set` (most
probable first) and `set_size` are its conformal prediction set, when the export stores thresholds.
"""

from __future__ import annotations

import csv
import io
import json
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from compressor.core.device import resolve_device
from compressor.core.errors import InputError
from compressor.core.folders import marked_above
from compressor.core.io import json_text
from compressor.core.schema import MAX_BATCH
from compressor.uq.calibrated import Calibrated
from compressor.uq.conformal import prediction_sets
from compressor.uq.outputs import ensemble_probs, logits_reader
from compressor.uq.scores import ood_score

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}


def _read_lines(inputs: Path, what: str) -> list[str]:
    """The non-empty lines of a UTF-8 text file; a one-line InputError otherwise."""
    try:
        return [line for line in inputs.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as e:
        raise InputError(f"{inputs}: not UTF-8 text (byte {e.start}); expected {what}") from e
    except OSError as e:
        raise InputError(f"{inputs}: cannot be read ({e.strerror}); expected {what}") from e


def _table_column(inputs: Path, column: str | None) -> list | None:
    """The column of a CSV / JSON Lines / Parquet file (None when the input is not such a table)."""
    from compressor.data.tables import TABLE_SUFFIXES, read_column

    if column is None and inputs.suffix.lower() not in (".csv", ".parquet"):
        return None  # .txt, a folder, an image, or .jsonl read with its 'text' field below
    if inputs.is_dir() or inputs.suffix.lower() not in TABLE_SUFFIXES:
        raise InputError(f"{inputs}: --column reads a .csv, .jsonl or .parquet file")
    if column is None:
        raise InputError(f"{inputs}: a table; expected --column naming its text or image-path column")
    return read_column(inputs, column)


def _image_paths(inputs: Path, column: str | None = None) -> list[Path]:
    cells = _table_column(inputs, column)
    if cells is not None:
        paths = [Path(c) if Path(str(c)).is_absolute() else inputs.parent / str(c) for c in cells]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise InputError(f"{inputs}: column '{column}' names {len(missing)} missing image files, e.g. {missing[0]}")
    elif inputs.is_dir():
        paths = sorted(p for p in inputs.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    elif inputs.suffix.lower() in IMAGE_SUFFIXES:
        paths = [inputs]  # one image
    else:
        lines = [line.strip() for line in _read_lines(inputs, "an image folder, an image, or a list of image paths")]
        paths = [(inputs.parent / line) if not Path(line).is_absolute() else Path(line) for line in lines]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise InputError(f"{inputs}: lists {len(missing)} missing image files, e.g. {missing[0]}")
    if not paths:
        raise InputError(f"{inputs}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return paths


def _texts(inputs: Path, column: str | None = None) -> list[str]:
    cells = _table_column(inputs, column)
    if cells is not None:
        bad = next((i for i, t in enumerate(cells) if not isinstance(t, str) or not t.strip()), None)
        if bad is not None:
            raise InputError(f"{inputs}: column '{column}', row {bad}: {cells[bad]!r}; expected a non-empty text")
        return list(cells)
    if inputs.is_dir():
        raise InputError(f"{inputs}: a text model expects a .txt file (one sentence per line) or .jsonl, not a folder")
    lines = _read_lines(inputs, "a .txt file (one sentence per line) or .jsonl with a 'text' field")
    if not lines:
        raise InputError(f"{inputs}: no texts (every line is empty)")
    if inputs.suffix.lower() != ".jsonl":
        return [line.strip() for line in lines]
    texts = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
            texts.append(str(row["text"]))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise InputError(f"{inputs}: line {i + 1}: expected a JSON object with a 'text' field") from e
    return texts


def _batches(
    model: nn.Module, inputs: Path, batch_size: int, column: str | None = None
) -> tuple[int, Iterator[tuple[list[str], torch.Tensor]]]:
    """The number of batches, and the (names, model inputs) batches made lazily (one in memory at
    a time) by the export's recorded preprocessing. Every input is listed and checked first."""
    prep = model.preprocessing if isinstance(model, Calibrated) else {}
    if prep.get("kind") == "text":
        from transformers import AutoTokenizer

        texts = _texts(inputs, column)
        tok = AutoTokenizer.from_pretrained(prep["tokenizer"])

        def text_batches() -> Iterator[tuple[list[str], torch.Tensor]]:
            for i in range(0, len(texts), batch_size):
                chunk = texts[i : i + batch_size]
                ids = tok(
                    chunk, padding="max_length", truncation=True, max_length=prep["max_length"], return_tensors="pt"
                )
                yield chunk, ids["input_ids"]

        return -(-len(texts) // batch_size), text_batches()
    if prep.get("kind") != "image":
        raise InputError("export: config.json records no preprocessing; re-export it with this version")
    import timm.data

    from compressor.data.images import open_image

    settings = {k: (tuple(v) if isinstance(v, list) else v) for k, v in prep.items() if k != "kind"}
    transform = timm.data.create_transform(**settings, is_training=False)
    mode = "L" if settings["input_size"][0] == 1 else "RGB"
    paths = _image_paths(inputs, column)

    def image_batches() -> Iterator[tuple[list[str], torch.Tensor]]:
        for i in range(0, len(paths), batch_size):
            chunk = paths[i : i + batch_size]
            yield [str(p) for p in chunk], torch.stack([transform(open_image(p, mode)) for p in chunk])

    return -(-len(paths) // batch_size), image_batches()


def _rows(
    names: Sequence[str],
    logits: torch.Tensor,
    mean: torch.Tensor,
    classes: Sequence[str],
    ood: dict,
    top_k: int,
    conformal: dict | None = None,
    score: torch.Tensor | None = None,
) -> list[dict]:
    """One row per input from member logits [M, B] and the ensemble prediction `mean` [B, C];
    `score`: each input's OOD score for the stored threshold `ood` (float64, as the calibrate step
    computed the threshold; `Calibrated.scored`)."""
    probs = logits.double().softmax(-1)  # [M, B, C]
    mean = mean.double()
    conf, pred = mean.max(-1)
    top = mean.topk(min(top_k, mean.shape[-1]), dim=-1)
    entropy = ood_score(probs, "entropy", mean)
    ensemble = probs.shape[0] > 1
    mi = ood_score(probs, "mi") if ensemble else None
    member_pred = probs.argmax(-1)  # [M, B]
    score = score if ood else None
    method = (conformal or {}).get("method")
    sets = prediction_sets(mean, conformal[method], method) if method else None
    name = lambda c: classes[c] if c < len(classes) else str(c)  # noqa: E731
    rows = []
    for i, n in enumerate(names):
        row: dict[str, Any] = {
            "input": n,
            "prediction": name(int(pred[i])),
            "probability": round(float(conf[i]), 6),
            "top_k": [[name(int(c)), round(float(p), 6)] for p, c in zip(top.values[i], top.indices[i])],
            "max_softmax": round(float(conf[i]), 6),
            "entropy": round(float(entropy[i]), 6),
        }
        if ensemble:
            row["mutual_information"] = round(float(mi[i]), 6)
            row["disagreement"] = round(float((member_pred[:, i] != pred[i]).float().mean()), 6)
            row["member_predictions"] = [name(int(c)) for c in member_pred[:, i]]
        row["ood_score"] = None if score is None else round(float(score[i]), 6)
        row["ood"] = None if score is None else bool(score[i] > ood["threshold"])
        if sets is not None:
            members = sets[i].nonzero().flatten().tolist()
            row["prediction_set"] = [name(c) for c in sorted(members, key=lambda c: -float(mean[i, c]))]
            row["set_size"] = len(members)
        rows.append(row)
    return rows


def check_options(batch_size: int, top_k: int) -> None:
    """One-line InputErrors for a batch size or top-k that cannot work."""
    if not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH:
        raise InputError(f"--batch-size: expected an integer in 1..{MAX_BATCH}, got {batch_size!r}")
    if not isinstance(top_k, int) or top_k < 1:
        raise InputError(f"--top-k: expected an integer >= 1, got {top_k!r}")


@torch.no_grad()
def predict_inputs(
    model: nn.Module | str | Path,
    inputs: str | Path,
    batch_size: int = 64,
    top_k: int = 3,
    device: str = "cpu",
    progress: bool = False,
    column: str | None = None,
) -> list[dict]:
    """Per-sample predictions (dicts with the fields the module docstring lists) for `inputs`,
    from an export folder or a model `compressor.load` returned; `column`: the text (or image
    path) column of a CSV, JSON Lines or Parquet file, predicted in the file's row order."""
    check_options(batch_size, top_k)
    device = str(resolve_device(device, "--device"))
    inputs = Path(inputs)
    if not inputs.exists():
        raise InputError(f"{inputs}: no such file or folder")
    if not isinstance(model, nn.Module):
        from compressor.deploy.export import load_export

        model = load_export(model, map_location=device)
    model = model.to(device).eval()
    read = logits_reader(model)
    ood = model.ood if isinstance(model, Calibrated) else {}
    conformal = model.conformal if isinstance(model, Calibrated) else {}
    classes = model.class_names if isinstance(model, Calibrated) else []
    rows: list[dict] = []
    total, batches = _batches(model, inputs, batch_size, column)
    for names, x in tqdm(batches, total=total, desc="predict", disable=None if progress else True):
        out, score = model.scored(x.to(device)) if isinstance(model, Calibrated) else (model(x.to(device)), None)
        logits = read(out)
        rows += _rows(names, logits, ensemble_probs(out, logits), classes, ood, top_k, conformal, score)
    return rows


OUTPUT_FORMATS = (".csv", ".jsonl")


def check_output(out: Path | None, export: Path | None = None, overwrite: bool = True) -> None:
    """A one-line InputError, before predicting, for an --out that names no format, a folder, a
    folder that does not exist, a file inside the export, or an existing file without `overwrite`."""
    if out is None:
        return
    if out.suffix.lower() not in OUTPUT_FORMATS:
        raise InputError(f"--out {out}: expected a file ending in {' or '.join(OUTPUT_FORMATS)}, got {out.suffix!r}")
    if out.is_dir():
        raise InputError(f"--out {out}: is a folder; expected a file name")
    if not out.parent.resolve().is_dir():
        raise InputError(f"--out {out}: no folder {out.parent}; create it first")
    if export is not None and export.resolve() in out.resolve().parents:
        raise InputError(f"--out {out}: inside the export {export}; write predictions elsewhere")
    inside = marked_above(out, ("export",))
    if inside is not None:
        raise InputError(f"--out {out}: inside the export folder {inside}; write predictions elsewhere")
    if out.exists() and not overwrite:
        raise InputError(f"--out {out}: exists; pass --overwrite to replace it")
    try:  # writable, found now rather than after predicting
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"):
            pass
    except OSError as e:
        raise InputError(f"--out {out}: cannot write in {out.parent} ({e.strerror or e})") from e


def write_predictions(rows: list[dict], out: Path | None) -> str:
    """Rows as JSONL (out ends with .jsonl) or CSV (out ends with .csv, or no `out`; lists joined
    with ';'); written to `out` atomically, or returned as text when `out` is None."""
    check_output(out)
    if out is not None and out.suffix.lower() == ".jsonl":
        text = "".join(json_text(r, indent=None) + "\n" for r in rows)
    else:
        buf = io.StringIO()
        fields = list(rows[0]) if rows else ["input"]
        writer = csv.DictWriter(buf, fieldnames=fields)
        writer.writeheader()
        for r in rows:
            writer.writerow(
                {
                    k: ";".join(":".join(map(str, x)) if isinstance(x, list) else str(x) for x in v)
                    if isinstance(v, list)
                    else v
                    for k, v in r.items()
                }
            )
        text = buf.getvalue()
    if out is not None:
        from compressor.core.io import atomic_write_text

        atomic_write_text(out, text)
    return text
