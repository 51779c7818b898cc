"""Edited or corrupted exports are refused before anything is built, naming the file and the key."""

import json
from pathlib import Path

import pytest

from compressor.core.errors import ExportError
from compressor.core.io import file_sha256
from compressor.core.masks import HeadMask
from compressor.core.weights import save_weights
from compressor.data import digits_bundle
from compressor.deploy.export import export_model, load_export
from compressor.deploy.manifest import MANIFEST, write_manifest
from compressor.run.cli import main
from mergers.hydra import build_hydra

from .conftest import make_vit


@pytest.fixture
def hydra_export(tmp_path):
    vit = make_vit("tiny_cls")
    masks = [HeadMask.from_kept([[0, 1], [2]], [4, 4]), HeadMask.from_kept([[3], [0, 1, 3]], [4, 4])]
    folder = tmp_path / "exp"
    export_model(
        build_hydra(vit, masks, mlp_mode="grouped"), folder, masks, preprocessing=digits_bundle().preprocessing
    )
    return folder


def _edit_config(folder: Path, change, rehash: bool = True) -> None:
    """Edit config.json; `rehash` also rewrites the manifest (an editor who knows it), so that the
    checks behind the manifest are what a test meets."""
    cfg = json.loads((folder / "config.json").read_text())
    change(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    if rehash:
        write_manifest(folder)


EXPORT_CASES = [
    ("heads-negative", lambda c: c["hydra_spec"]["heads"][0].__setitem__(0, -2), "hydra_spec.heads: expected"),
    ("heads-swapped", lambda c: c["hydra_spec"].__setitem__("heads", [[1, 2], [3, 1]]), "do not match the head counts"),
    ("spec-unknown-key", lambda c: c["hydra_spec"].__setitem__("evil", 1), "hydra_spec: unknown keys ['evil']"),
    ("members-type", lambda c: c["hydra_spec"].__setitem__("members", "2"), "hydra_spec.members: expected"),
    (
        "checkpoint-kwarg",
        lambda c: c["hydra_spec"]["arch"]["kwargs"].__setitem__("checkpoint_path", "/x.pth"),
        "arch.kwargs.checkpoint_path: not an architecture argument",
    ),
    ("kind-import-path", lambda c: c.__setitem__("kind", "os:system"), "kind: expected a registered merger name"),
    ("kind-unknown", lambda c: c.__setitem__("kind", "glue"), "kind: unknown merger 'glue'"),
    ("format", lambda c: c.__setitem__("format", "v0"), "format: expected 'compressor.export/2'"),
    ("class-names", lambda c: c.__setitem__("class_names", [1, 2]), "class_names: expected a list of strings"),
    ("temperature", lambda c: c.__setitem__("calibration", {"temperature": [-1.0]}), "calibration.temperature"),
    *[
        (
            f"threshold-{bad}",
            lambda c, bad=bad: c.__setitem__(
                "calibration", {"temperature": [1.0], "ood": {"score": "msp", "tpr": 0.95, "threshold": bad}}
            ),
            "calibration.ood: expected a score (msp, entropy, mi, mahalanobis) and a finite threshold",
        )
        for bad in (float("nan"), float("inf"), "0.5", True)
    ],
]


@pytest.mark.parametrize("case", EXPORT_CASES, ids=[c[0] for c in EXPORT_CASES])
def test_edited_exports_are_refused_naming_file_and_key(case, hydra_export, tmp_path, capsys):
    name, change, text = case
    _edit_config(hydra_export, change)
    with pytest.raises(ExportError, match="config.json"):
        load_export(hydra_export)
    code = main(["predict", str(hydra_export), str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and str(hydra_export / "config.json") in err[0] and text in err[0], err


def test_changed_weights_and_masks_are_detected(hydra_export):
    weights = hydra_export / "model.safetensors"
    state = load_export(hydra_export).model.state_dict()
    state["heads.0.head.bias"] = state["heads.0.head.bias"] + 1
    save_weights(state, weights)
    with pytest.raises(ExportError, match="model.safetensors: sha256 differs from manifest.json"):
        load_export(hydra_export)
    write_manifest(hydra_export)
    with pytest.raises(ExportError, match="config.json: weights_sha256: differs from manifest.json"):
        load_export(hydra_export)  # the manifest alone re-hashed: config.json still names the old weights
    _edit_config(hydra_export, lambda c: c.__setitem__("weights_sha256", file_sha256(weights)))
    load_export(hydra_export)  # both re-hashed: an ordinary weight change loads
    masks = json.loads((hydra_export / "masks.json").read_text())
    masks["members"][0]["kept"][0] = [2, 3]
    (hydra_export / "masks.json").write_text(json.dumps(masks))
    with pytest.raises(ExportError, match="masks.json: sha256 differs from manifest.json"):
        load_export(hydra_export)
    write_manifest(hydra_export)
    with pytest.raises(ExportError, match="masks.json: differs from the masks config.json records"):
        load_export(hydra_export)


def test_weights_outside_the_specs_heads_are_refused(tmp_path):
    """A spec edited to give a member fewer heads than its weights hold: the padding is not zero."""
    vit = make_vit("tiny_cls")
    masks = [HeadMask.from_kept([[0, 1, 2], [2]], [4, 4]), HeadMask.from_kept([[3], [0, 1, 3]], [4, 4])]
    export_model(build_hydra(vit, masks, mlp_mode="grouped"), tmp_path / "e")

    def fewer(c):
        c["hydra_spec"]["heads"][0] = [3, 0]  # member 1 keeps a head its weights still hold
        c.pop("masks")

    (tmp_path / "e" / "masks.json").unlink(missing_ok=True)
    _edit_config(tmp_path / "e", fewer)
    with pytest.raises(ExportError, match="non-zero padding"):
        load_export(tmp_path / "e")


def test_an_ensemble_ood_score_on_a_single_model_export_is_refused(tmp_path):
    from compressor.uq.calibrated import Calibrated
    from mergers.plain import prune_physically

    vit = make_vit("tiny_cls")
    mask = HeadMask.from_kept([[0, 1], [2]], [4, 4])
    ood = {"score": "msp", "tpr": 0.95, "threshold": -0.5}
    export_model(Calibrated(prune_physically(vit, mask), 1.0, ood), tmp_path / "e", [mask])
    load_export(tmp_path / "e")  # msp: fine on one model
    _edit_config(tmp_path / "e", lambda c: c["calibration"]["ood"].__setitem__("score", "mi"))
    with pytest.raises(ExportError, match=r"calibration.ood.score: 'mi' needs an ensemble; one member"):
        load_export(tmp_path / "e")


def test_an_edit_without_the_manifest_or_a_missing_manifest_is_refused(hydra_export):
    _edit_config(hydra_export, lambda c: c.__setitem__("class_names", ["x"] * 8), rehash=False)
    with pytest.raises(ExportError, match=r"config.json: sha256 differs from manifest.json \(edited or damaged\)"):
        load_export(hydra_export)
    write_manifest(hydra_export)
    load_export(hydra_export)
    (hydra_export / MANIFEST).unlink()
    with pytest.raises(ExportError, match="manifest.json: missing; expected an export written by this version"):
        load_export(hydra_export)
    (hydra_export / MANIFEST).write_text('{"format": "compressor.manifest/1", "files": {"config.json": 3}}')
    with pytest.raises(ExportError, match="manifest.json: files: expected"):
        load_export(hydra_export)
    write_manifest(hydra_export)
    (hydra_export / "model.safetensors").unlink()
    with pytest.raises(ExportError, match="model.safetensors: missing; manifest.json lists it"):
        load_export(hydra_export)


def test_sizes_in_the_config_are_checked_against_the_weights_before_allocation(hydra_export):
    """A spec widened to 60,000 channels (about 40 GB of parameters) is refused from the weights'
    header, in a process whose memory stays far below what building it would take."""
    import subprocess
    import sys

    _edit_config(hydra_export, lambda c: c["hydra_spec"].__setitem__("dim", 60000))
    script = (
        "import resource, sys\n"
        "from compressor.deploy.export import load_export\n"
        "try:\n"
        f"    load_export({str(hydra_export)!r})\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, str(e)[:300])\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300).stdout
    message, peak_gib = out.strip().splitlines()[-2], float(out.strip().splitlines()[-1])
    assert message.startswith("WeightsError") and "expected [60000] found [48]" in message, out
    assert peak_gib < 2.0, peak_gib
