"""Hostile and careless `compressor apply` / `validate` runs: folders the project did not write,
run folders inside others, files timm would open itself, pickles, data folders with links and
bombs. Each case: exit code 2, one line naming the file and key or flag and what was expected,
before any training (no base cache appears), and nothing changed, the run folder included (a
sentinel tree's checksum: a run refused before it wrote anything removes the folder it created)."""

import copy
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from compressor.core.folders import write_marker
from compressor.core.weights import save_weights

from .helpers import run_hostile
from .test_bad_inputs import RECIPE
from .test_hostile_predict import Pwn, _png_header
from .test_real_inputs import _image_folder

OUT = "runs/bad"


def _mkdir_files(*names: str, marker: str | None = None, at: str = OUT):
    """A setup: folder `at` holding `names` (and a marker of kind `marker`)."""

    def setup(t: Path, recipe: dict) -> list[str]:
        folder = t / at
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(f"a user's {name}")
        if marker:
            write_marker(folder, marker)
        return []

    return setup


def _both(*setups):
    def setup(t: Path, recipe: dict) -> list[str]:
        return [arg for s in setups for arg in s(t, recipe)]

    return setup


def _args(*argv: str):
    return lambda t, recipe: list(argv)


def _key(path: str, value):
    """A setup that sets a recipe key (dotted, list items by index); `value` may be a function of the folder."""

    def setup(t: Path, recipe: dict) -> list[str]:
        *keys, last = path.split(".")
        node = recipe
        for k in keys:
            node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
        node[int(last) if isinstance(node, list) else last] = value(t) if callable(value) else value
        return []

    return setup


def _pickle(name: str, obj):
    def make(t: Path) -> str:
        (t / name).write_bytes(pickle.dumps(obj))
        return str(t / name)

    return make


def _torch_save(name: str, obj):
    def make(t: Path) -> str:
        torch.save(obj, t / name)
        return str(t / name)

    return make


def _images(change=None):
    """A setup: recipe data from a small image folder under `images/`, changed by `change(root)`."""

    def setup(t: Path, recipe: dict) -> list[str]:
        root = _image_folder(t / "images", size=16)
        if change:
            change(root)
        recipe["data"] = {"source": "image_folder", "root": str(root), "batch_size": 8, "augment": "none"}
        return []

    return setup


def _link(at: str, target: str):
    return lambda root: (root / at).symlink_to(target if target.startswith("/") else root / target)


def _bomb(root: Path) -> None:
    (root / "val" / "horizontal" / "0.png").write_bytes(_png_header(20000, 20000))


def _fake(root: Path) -> None:
    (root / "val" / "horizontal" / "0.png").write_text("not an image")


def _hf_folder(weights: str):
    """A setup: a `source: hf` recipe on a small BERT folder `enc/` (MiniLM's tokenizer) whose
    weights are `weights`: safetensors (good), nan, shape, missing, pickle (code on load) or state-dict (a
    pickled state dict in pytorch_model.bin, the file transformers would torch.load itself)."""

    def setup(t: Path, recipe: dict) -> list[str]:
        from transformers import BertConfig, BertModel

        from compressor.data.text import minilm_path

        folder = t / "enc"
        config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
        BertModel(config).save_pretrained(folder)
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            if (minilm_path() / name).is_file():
                shutil.copy(minilm_path() / name, folder / name)
        state = load_file(folder / "model.safetensors")
        if weights == "nan":
            state["embeddings.word_embeddings.weight"][0, 0] = float("nan")
        if weights == "shape":
            state["encoder.layer.0.attention.self.query.weight"] = torch.zeros(16, 32)
        if weights == "missing":
            del state["encoder.layer.1.output.dense.weight"]
        if weights in ("nan", "shape", "missing"):
            save_file(state, folder / "model.safetensors")
        if weights in ("pickle", "state-dict"):
            (folder / "model.safetensors").unlink()
            write = _pickle if weights == "pickle" else _torch_save
            write("enc/pytorch_model.bin", Pwn() if weights == "pickle" else state)(t)
        recipe["model"] = {"source": "hf", "name": str(folder)}
        recipe["data"] = {
            "source": "text",
            "task": "topics",
            "max_samples": 40,
            "max_length": 16,
            "calibration_samples": 16,
        }
        return []

    return setup


# (id, setup(tmp folder, recipe) -> extra argv, commands, texts of the one line)
APPLY = (["apply", "--quiet"],)
BOTH = (["validate"], ["apply", "--quiet"])
RUN_CASES = [
    (
        "overwrite-unmarked",
        _both(_mkdir_files("report.md", "thesis.tex"), _args("--overwrite")),
        APPLY,
        ["holds report.md but no .compressor-run marker"],
    ),
    (
        "overwrite-unmarked-export",
        _both(_mkdir_files("report.md", "export/thesis.tex", marker="run"), _args("--overwrite")),
        APPLY,
        ["export.dir names a folder without the .compressor-export marker"],
    ),
    ("earlier-outputs", _mkdir_files("metrics.json", marker="run"), APPLY, ["holds an earlier run's outputs"]),
    (
        "out-inside-run",
        _both(_mkdir_files("notes.txt", marker="run", at="runs/a"), _args("--out", "runs/a/b")),
        APPLY,
        ["inside the run folder", "runs/a; expected a run folder of its own"],
    ),
    (
        "out-is-export",
        _both(_mkdir_files("x", marker="export", at="exp"), _args("--out", "exp")),
        APPLY,
        ["exp: is an export folder"],
    ),
    (
        "out-inside-export",
        _both(_mkdir_files("x", marker="export", at="exp"), _args("--out", "exp/run")),
        APPLY,
        ["inside the export folder"],
    ),
    ("out-file", _both(_mkdir_files(at="runs"), lambda t, r: (t / OUT).write_text("x") and []), APPLY, ["is a file"]),
    (
        "recipe-out-inside-run",
        _both(_mkdir_files("notes.txt", marker="run", at="runs/a"), _key("out", "runs/a/b")),
        BOTH,
        ["out: runs/a/b: inside the run folder"],
    ),
    ("export-dot", _key("steps.3.export.dir", "./"), BOTH, ["export.dir: expected a relative folder inside"]),
    ("export-up", _key("steps.3.export.dir", "../up"), BOTH, ["export.dir: expected a relative folder inside"]),
    ("export-absolute", _key("steps.3.export.dir", "/tmp/x"), BOTH, ["export.dir: expected a relative folder"]),
    ("export-plots", _key("steps.3.export.dir", "plots"), BOTH, ["not the run's 'plots'"]),
    ("export-hidden", _key("steps.3.export.dir", ".cache"), BOTH, ["not the run's '.cache'"]),
    (
        "cache-dir-file",
        _both(_mkdir_files("f", at="c"), _key("cache_dir", "c/f")),
        BOTH,
        ["cache_dir: 'c/f' is a file; expected a folder"],
    ),
    (
        "kwargs-checkpoint-pickle",
        _key("model.kwargs.checkpoint_path", _pickle("evil.pth", Pwn())),
        BOTH,
        ["model.kwargs.checkpoint_path: timm would open this file itself", "expected model.checkpoint"],
    ),
    (
        "kwargs-checkpoint-state-dict",
        _key("model.kwargs.checkpoint_path", _torch_save("wrong.pth", {"head.weight": torch.zeros(3, 3)})),
        BOTH,
        ["model.kwargs.checkpoint_path: timm would open"],
    ),
    (
        "kwargs-overlay-file",
        _key("model.kwargs.pretrained_cfg_overlay", lambda t: {"file": _pickle("evil.bin", Pwn())(t)}),
        BOTH,
        ["model.kwargs.pretrained_cfg_overlay.file: timm would open"],
    ),
    (
        "kwargs-cfg-file",
        _key("model.kwargs.pretrained_cfg", lambda t: {"file": _pickle("evil.bin", Pwn())(t)}),
        BOTH,
        ["model.kwargs.pretrained_cfg.file: timm would open"],
    ),
    ("kwargs-overlay-hub", _key("model.kwargs.pretrained_cfg_overlay", {"hf_hub_id": "x/y"}), BOTH, ["hf_hub_id"]),
    ("kwargs-overlay-url", _key("model.kwargs.pretrained_cfg_overlay", {"url": "http://x"}), BOTH, ["overlay.url"]),
    ("kwargs-cache-dir", _key("model.kwargs.cache_dir", "/tmp"), BOTH, ["model.kwargs.cache_dir: timm would open"]),
    ("kwargs-any-path", _key("model.kwargs.weights_path", "w.pt"), BOTH, ["model.kwargs.weights_path: timm would"]),
    ("kwargs-pretrained", _key("model.kwargs.pretrained", True), BOTH, ["model.kwargs.pretrained: expected model."]),
    (
        "checkpoint-pickle",
        _key("model.checkpoint", _pickle("evil.safetensors", Pwn())),
        BOTH,
        ["model.checkpoint", "evil.safetensors: not a valid safetensors file"],
    ),
    (
        "checkpoint-pickled-state-dict",
        _key("model.checkpoint", _torch_save("wrong.pth", {"head.weight": torch.zeros(3, 3)})),
        BOTH,
        ["model.checkpoint", "wrong.pth: not a valid safetensors file"],
    ),
    (
        "checkpoint-wrong-shape",
        _key(
            "model.checkpoint",
            lambda t: save_weights({"head.weight": torch.zeros(3, 3)}, t / "w.st") or str(t / "w.st"),
        ),
        BOTH,
        ["model.checkpoint", "weights do not fit the model"],
    ),
    ("keep-all-heads", _key("steps.0.prune.keep_ratio", 1.0), BOTH, ["keep_ratio"]),
    (
        "mi-one-member",
        _both(
            _key("steps", lambda t: [*copy.deepcopy(RECIPE["steps"][:2]), {"calibrate": {"ood_score": "mi"}}]),
            _key("steps.0.prune.members", 1),
        ),
        BOTH,
        ["steps[2].calibrate"],
    ),
    (
        "mahalanobis-no-classifier",
        _both(
            _key("steps", lambda t: [*copy.deepcopy(RECIPE["steps"][:2]), {"calibrate": {"ood_score": "mahalanobis"}}]),
            _key("model.kwargs.num_classes", 0),
        ),
        BOTH,
        ["steps[2].calibrate", "ood_score: 'mahalanobis' reads the pooled features", "classifier is Identity"],
    ),
    ("data-link-loop", _images(_link("train/horizontal/loop", "train")), BOTH, ["data.root:", "a link loop"]),
    ("data-link-outside", _images(_link("train/horizontal/x.png", "/etc/hostname")), BOTH, ["outside"]),
    ("data-duplicate", _images(_link("val/vertical/dup.png", "train/horizontal/1.png")), BOTH, ["the same file"]),
    ("data-bomb", _images(_bomb), BOTH, ["0.png: too large to decode; expected at most 67,108,864 pixels"]),
    ("data-fake-image", _images(_fake), BOTH, ["0.png: not a readable image"]),
    ("hf-kwargs", _both(_key("model.source", "hf"), _key("model.kwargs", {"x": 1})), BOTH, ["source: hf model takes"]),
    ("hf-folder-pickle", _hf_folder("pickle"), BOTH, ["model.name: cannot load", "expected a folder", "safetensors"]),
    ("hf-folder-pickled-state-dict", _hf_folder("state-dict"), BOTH, ["model.name: cannot load", "never loaded"]),
    ("hf-folder-nan", _hf_folder("nan"), BOTH, ["model.name:", "enc': weights hold NaN", "word_embeddings"]),
    ("hf-folder-missing", _hf_folder("missing"), BOTH, ["model.name:", "weights missing", "1.output.dense.weight"]),
    ("hf-folder-wrong-shape", _hf_folder("shape"), BOTH, ["model.name:", "shapes do not fit", "query.weight"]),
]


@pytest.mark.parametrize("case", RUN_CASES, ids=[c[0] for c in RUN_CASES])
def test_hostile_runs_fail_before_work_in_one_line(case, tmp_path, monkeypatch, capsys):
    _, setup, commands, texts = case
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()  # the runs folder exists, as after a first run
    recipe = copy.deepcopy(RECIPE)
    extra = setup(tmp_path, recipe)
    capsys.readouterr()  # what a setup printed (transformers' save bars) is not the command's
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    for command in commands:
        # a refused run leaves every folder as it found it, its own run folder included
        code, err = run_hostile([*command, str(path), *extra], tmp_path, capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith("error: "), (command, err)
        assert all(t in err[0] for t in texts), (command, err[0])
        assert not (tmp_path / "runs" / ".cache").exists(), "a base model was trained"


def test_overwrite_replaces_only_what_a_marked_run_wrote(tmp_path, monkeypatch, capsys):
    """The positive side: a marked run folder's outputs are replaced; a user's file beside them stays."""
    monkeypatch.chdir(tmp_path)
    recipe = copy.deepcopy(RECIPE)
    recipe["steps"] = recipe["steps"][:1]
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    from compressor.run.cli import main

    assert main(["apply", "--quiet", str(path)]) == 0
    (tmp_path / OUT / "notes.txt").write_text("mine")
    before = (tmp_path / OUT / "masks.json").stat().st_mtime_ns
    assert main(["apply", "--quiet", str(path), "--overwrite"]) == 0
    assert (tmp_path / OUT / "notes.txt").read_text() == "mine"
    assert (tmp_path / OUT / "masks.json").stat().st_mtime_ns != before
    capsys.readouterr()


def test_hf_folder_with_safetensors_validates(tmp_path, monkeypatch, capsys):
    """The control for the hf-folder cases: the same small folder with sound safetensors weights passes."""
    monkeypatch.chdir(tmp_path)
    recipe = copy.deepcopy(RECIPE)
    _hf_folder("safetensors")(tmp_path, recipe)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    from compressor.run.cli import main

    assert main(["validate", str(path)]) == 0, capsys.readouterr().err
