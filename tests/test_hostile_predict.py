"""Hostile and careless `compressor predict` calls: bad flags, bad --out, bad inputs, tampered
exports (image and text). Each case: exit code 2, one line naming the flag or file and what was
expected, in seconds, and nothing under the test's folder changed (a sentinel tree's checksum)."""

import json
import pickle
import shutil
import struct
import zlib
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from compressor.core.masks import HeadMask
from compressor.core.weights import save_weights
from compressor.data import digits_preprocessing
from compressor.deploy.export import export_model
from compressor.deploy.manifest import write_manifest
from compressor.uq.calibrated import Calibrated
from mergers.hydra import build_hydra

from .conftest import make_vit
from .helpers import run_hostile


class Pwn:
    """A pickle that would create the file PWNED when unpickled."""

    def __reduce__(self):
        return (Path.touch, (Path("PWNED"),))


@pytest.fixture(scope="module")
def image_export(tmp_path_factory):
    vit = make_vit("tiny_cls")
    masks = [HeadMask.from_kept([[0, 1], [2, 3]], [4, 4]), HeadMask.from_kept([[1, 2], [0, 3]], [4, 4])]
    model = Calibrated(
        build_hydra(vit, masks, mlp_mode="grouped"), 1.5, {"score": "msp", "tpr": 0.95, "threshold": -0.2}
    )
    folder = tmp_path_factory.mktemp("image") / "exp"
    export_model(model, folder, masks, [str(c) for c in range(8)], preprocessing=digits_preprocessing(16))
    return folder


@pytest.fixture(scope="module")
def text_export(tmp_path_factory):
    from transformers import AutoTokenizer, BertConfig, BertModel

    from compressor.data.text import minilm_path
    from compressor.families.classifiers import MeanPoolClassifier

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(minilm_path()))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                     intermediate_size=64)  # fmt: skip
    model = MeanPoolClassifier(BertModel(cfg), 2, tok.pad_token_id).eval()
    folder = tmp_path_factory.mktemp("text") / "exp"
    prep = {"kind": "text", "tokenizer": str(minilm_path()), "max_length": 16}
    export_model(Calibrated(model, 1.0, {}), folder, None, ["neg", "pos"], preprocessing=prep)
    return folder


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares width x height (grey) with almost no data: a decompression bomb's header."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def _images(folder: Path, n: int = 2) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("L", (16, 16), color=30 * i).save(folder / f"d{i}.png")
    return folder


def _edit(change, rehash: bool = True):
    """A setup that edits the export's config.json (and rewrites its manifest, as an editor who knows it would)."""

    def setup(t: Path) -> None:
        cfg = json.loads((t / "exp" / "config.json").read_text())
        change(cfg)
        (t / "exp" / "config.json").write_text(json.dumps(cfg))
        if rehash:
            write_manifest(t / "exp")

    return setup


def _set(key_path: str, value):
    def change(cfg):
        *keys, last = key_path.split(".")
        node = cfg
        for k in keys:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[int(last) if isinstance(node, list) else last] = value

    return change


def _write(name: str, content: bytes | str):
    def setup(t: Path) -> None:
        path = t / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())

    return setup


def _weights(change):
    """A setup that rewrites model.safetensors (its config hash and manifest updated to match)."""

    def setup(t: Path) -> None:
        from compressor.core.io import file_sha256
        from compressor.core.weights import load_weights

        path = t / "exp" / "model.safetensors"
        change(path, {k: v.clone() for k, v in load_weights(path).items()})  # not the mapped file
        cfg = json.loads((t / "exp" / "config.json").read_text())
        cfg["weights_sha256"] = file_sha256(path)
        (t / "exp" / "config.json").write_text(json.dumps(cfg))
        write_manifest(t / "exp")

    return setup


def _nan_weights(path, state):
    first = next(k for k, v in state.items() if v.is_floating_point())
    state[first] = torch.full_like(state[first], float("nan"))
    save_file(state, str(path))  # what a careless tool writes (save_weights refuses NaN)


NONE = None  # no setup
IMAGES = "imgs"  # the default inputs: two small PNGs
# (id, setup(tmp folder), extra argv (inputs replaced when the first item is not a flag), texts of the one line)
IMAGE_CASES = [
    ("batch-size-0", NONE, ["--batch-size", "0"], ["--batch-size: expected an integer in 1..65536, got 0"]),
    ("batch-size-negative", NONE, ["--batch-size", "-5"], ["--batch-size: expected an integer in 1..65536"]),
    ("batch-size-huge", NONE, ["--batch-size", "100000000"], ["--batch-size: expected an integer in 1..65536"]),
    ("top-k-negative", NONE, ["--top-k", "-2"], ["--top-k: expected an integer >= 1, got -2"]),
    ("top-k-0", NONE, ["--top-k", "0"], ["--top-k: expected an integer >= 1, got 0"]),
    ("device-unknown", NONE, ["--device", "tpu"], ["--device: expected auto, cpu, cuda or cuda:N, got 'tpu'"]),
    ("device-mps", NONE, ["--device", "mps"], ["--device: expected auto, cpu, cuda or cuda:N"]),
    (
        "out-exists",
        _write("old.csv", "a user's file"),
        ["--out", "old.csv"],
        ["--out old.csv: exists; pass --overwrite"],
    ),
    ("out-in-export", NONE, ["--out", "exp/p.csv"], ["--out exp/p.csv: inside the export exp"]),
    ("out-weights", NONE, ["--out", "exp/model.safetensors"], ["expected a file ending in .csv or .jsonl"]),
    (
        "out-in-other-export",
        lambda t: shutil.copytree(t / "exp", t / "other"),
        ["--out", "other/p.csv"],
        ["--out other/p.csv: inside the export folder"],
    ),
    ("out-folder", lambda t: (t / "p.csv").mkdir(), ["--out", "p.csv"], ["--out p.csv: is a folder"]),
    ("out-missing-folder", NONE, ["--out", "nowhere/p.csv"], ["--out nowhere/p.csv: no folder nowhere"]),
    ("out-suffix", NONE, ["--out", "p.txt"], ["--out p.txt: expected a file ending in .csv or .jsonl, got '.txt'"]),
    ("out-unwritable", NONE, ["--out", "/proc/p.csv"], ["--out /proc/p.csv: cannot write in /proc"]),
    ("inputs-missing", NONE, ["nope"], ["nope: no such file or folder"]),
    ("inputs-not-utf8", _write("list.txt", b"\xff\xfe\x00bad"), ["list.txt"], ["list.txt: not UTF-8 text (byte 0)"]),
    ("inputs-list-missing", _write("list.txt", "gone.png\n"), ["list.txt"], ["list.txt: lists 1 missing image files"]),
    ("inputs-empty-folder", lambda t: (t / "empty").mkdir(), ["empty"], ["empty: no image files"]),
    ("inputs-fake-png", _write("bad/x.png", "not an image"), ["bad"], ["bad/x.png: not a readable image"]),
    (
        "inputs-bomb",
        _write("bomb/x.png", _png_header(20000, 20000)),
        ["bomb"],
        ["bomb/x.png: too large to decode; expected at most 67,108,864 pixels"],
    ),
    ("inputs-bomb-file", _write("x.png", _png_header(9000, 9000)), ["x.png"], ["x.png: 9000x9000 px, too large"]),
    ("inputs-truncated", _write("cut/x.png", _png_header(16, 16)[:40]), ["cut"], ["cut/x.png: not a readable image"]),
    ("inputs-list-text-file", _write("list.txt", "list.txt\n"), ["list.txt"], ["list.txt: not a readable image"]),
    ("export-missing", lambda t: shutil.rmtree(t / "exp"), [], ["exp: no such export folder"]),
    (
        "export-is-file",
        lambda t: (shutil.rmtree(t / "exp"), (t / "exp").write_text("x")),
        [],
        ["exp: no such export folder"],
    ),
    ("manifest-missing", lambda t: (t / "exp" / "manifest.json").unlink(), [], ["manifest.json: missing"]),
    ("config-edited", _edit(_set("class_names.0", "cat"), rehash=False), [], ["config.json: sha256 differs"]),
    ("config-not-json", _write("exp/config.json", "{"), [], ["config.json: sha256 differs"]),
    (
        "config-not-json-rehashed",
        lambda t: (_write("exp/config.json", "{")(t), write_manifest(t / "exp")),
        [],
        ["config.json: not valid JSON"],
    ),
    ("weights-hash-missing", _edit(lambda c: c.pop("weights_sha256")), [], ["weights_sha256: missing"]),
    ("weights-hash-other", _edit(_set("weights_sha256", "0" * 64)), [], ["weights_sha256: differs from manifest"]),
    (
        "temperatures-length",
        _edit(_set("calibration", {"temperature": [1.0, 2.0, 3.0], "temperature_scope": "member"})),
        [],
        ["calibration.temperature: 3 values for 2 members"],
    ),
    ("temperature-ensemble-two", _edit(_set("calibration.temperature", [1.0, 2.0])), [], ["one temperature"]),
    ("input-size-huge", _edit(_set("preprocessing.input_size", [1, 20000, 20000])), [], ["preprocessing.input_size"]),
    ("input-size-channels", _edit(_set("preprocessing.input_size", [7, 16, 16])), [], ["preprocessing.input_size"]),
    ("mean-length", _edit(_set("preprocessing.mean", [0.1, 0.2])), [], ["preprocessing.mean: expected 1 finite"]),
    ("std-zero", _edit(_set("preprocessing.std", [0.0])), [], ["preprocessing.std: expected 1 finite positive"]),
    ("interpolation", _edit(_set("preprocessing.interpolation", "magic")), [], ["preprocessing.interpolation"]),
    ("crop-pct", _edit(_set("preprocessing.crop_pct", 0.0)), [], ["preprocessing.crop_pct: expected a number"]),
    ("prep-kind", _edit(_set("preprocessing.kind", "audio")), [], ["preprocessing.kind: expected 'image' or 'text'"]),
    ("threshold-nan", _edit(_set("calibration.ood.threshold", float("nan"))), [], ["calibration.ood"]),
    ("threshold-inf", _edit(_set("calibration.ood.threshold", float("inf"))), [], ["calibration.ood"]),
    ("ood-score", _edit(_set("calibration.ood.score", "vibes")), [], ["calibration.ood"]),
    ("spec-dim-huge", _edit(_set("hydra_spec.dim", 1000000)), [], ["config.json"]),
    ("spec-members", _edit(_set("hydra_spec.members", 3)), [], ["config.json"]),
    ("masks-edited", _write("exp/masks.json", "[]"), [], ["masks.json: sha256 differs"]),
    ("weights-truncated", _write("exp/model.safetensors", b"\x08\x00\x00"), [], ["model.safetensors: sha256 differs"]),
    ("weights-nan", _weights(_nan_weights), [], ["model.safetensors", "NaN or inf weights"]),
    (
        "weights-pickle",
        _weights(lambda path, state: path.write_bytes(pickle.dumps(Pwn()))),
        [],
        ["model.safetensors: not a valid safetensors file"],
    ),
    (
        "weights-pickled-state-dict",
        _weights(lambda path, state: torch.save({k: v[:1] for k, v in state.items()}, path)),
        [],
        ["model.safetensors: not a valid safetensors file"],
    ),
    (
        "weights-wrong-shape",
        _weights(lambda path, state: save_weights({k: v.flatten()[:1].clone() for k, v in state.items()}, path)),
        [],
        ["weights do not fit the model"],
    ),
]


def _case(t: Path, export: Path, setup, argv: list[str], capsys, monkeypatch) -> tuple[int, list[str]]:
    monkeypatch.chdir(t)
    shutil.copytree(export, t / "exp")
    _images(t / IMAGES)
    if setup is not None:
        setup(t)
    inputs = [IMAGES] if not argv or argv[0].startswith("-") else []
    return run_hostile(["predict", "exp", *inputs, *argv], t, capsys)


@pytest.mark.parametrize("case", IMAGE_CASES, ids=[c[0] for c in IMAGE_CASES])
def test_hostile_predict_on_an_image_export(case, image_export, tmp_path, capsys, monkeypatch):
    _, setup, argv, texts = case
    code, err = _case(tmp_path, image_export, setup, argv, capsys, monkeypatch)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert all(t in err[0] for t in texts), err[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:3"])
def test_predict_on_a_missing_gpu_names_the_flag(device, image_export, tmp_path, capsys, monkeypatch):
    code, err = _case(tmp_path, image_export, None, ["--device", device], capsys, monkeypatch)
    assert code == 2 and err == [
        f"error: --device: '{device}' asked for, but no CUDA device is available (use cpu or auto)"
    ]


TEXT_CASES = [
    ("text-not-utf8", _write("in.txt", b"caf\xe9\n"), ["in.txt"], ["in.txt: not UTF-8 text (byte 3)"]),
    ("text-empty", _write("in.txt", "\n \n"), ["in.txt"], ["in.txt: no texts"]),
    ("jsonl-not-json", _write("in.jsonl", "{oops\n"), ["in.jsonl"], ["in.jsonl: line 1: expected a JSON object"]),
    (
        "jsonl-no-text",
        _write("in.jsonl", '{"body": "x"}\n'),
        ["in.jsonl"],
        ["line 1: expected a JSON object with a 'text'"],
    ),
    ("text-folder", lambda t: (t / "d").mkdir(), ["d"], ["d: a text model expects a .txt file"]),
    ("tokenizer-path", _edit(_set("preprocessing.tokenizer", "/etc")), ["in.txt"], ["preprocessing.tokenizer"]),
    ("tokenizer-outside", _edit(_set("preprocessing.tokenizer", "../x")), ["in.txt"], ["preprocessing.tokenizer"]),
    ("max-length", _edit(_set("preprocessing.max_length", 10**9)), ["in.txt"], ["preprocessing.max_length"]),
    ("tokenizer-added", _write("exp/tokenizer/vocab.txt", "[PAD]\n"), ["in.txt"], ["vocab.txt: not in manifest.json"]),
    ("tokenizer-edited", _write("exp/tokenizer/tokenizer_config.json", "{}"), ["in.txt"], ["sha256 differs"]),
]


@pytest.mark.parametrize("case", TEXT_CASES, ids=[c[0] for c in TEXT_CASES])
def test_hostile_predict_on_a_text_export(case, text_export, tmp_path, capsys, monkeypatch):
    _, setup, argv, texts = case
    monkeypatch.chdir(tmp_path)
    shutil.copytree(text_export, tmp_path / "exp")
    (tmp_path / "in.txt").write_text("a quiet triumph\n")
    if setup is not None:
        setup(tmp_path)
    code, err = run_hostile(["predict", "exp", *argv], tmp_path, capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert all(t in err[0] for t in texts), err[0]


def test_one_image_file_is_predicted(image_export, tmp_path, capsys, monkeypatch):
    """An image where a list was expected is a list of one (not an error)."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(image_export, tmp_path / "exp")
    _images(tmp_path / IMAGES)
    code, _ = run_hostile(["predict", "exp", f"{IMAGES}/d1.png", "--top-k", "100"], tmp_path, capsys)
    assert code == 0


def test_an_export_never_replaces_a_users_folder(tmp_path):
    from compressor.core.errors import ExportError

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    with pytest.raises(ExportError, match="no .compressor-export marker"):
        export_model(make_vit("tiny_cls"), tmp_path / "mine")
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "years of work"
    export_model(make_vit("tiny_cls"), tmp_path / "e")
    export_model(make_vit("tiny_cls"), tmp_path / "e")  # an earlier export is replaced
    with pytest.raises(ExportError, match="inside the export folder"):
        export_model(make_vit("tiny_cls"), tmp_path / "e" / "inner")
