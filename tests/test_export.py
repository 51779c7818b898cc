"""Export and `compressor.load`: identical outputs after a round trip; bad files fail clearly."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import compressor
from compressor.core.io import file_sha256
from compressor.core.masks import HeadMask
from compressor.core.weights import WeightsError
from compressor.deploy.export import ExportError, export_model
from compressor.deploy.manifest import write_manifest
from mergers.hydra import build_hydra
from mergers.plain import prune_physically

from .conftest import make_vit

MASKS = [HeadMask.from_kept([[0, 1], [2]], [4, 4]), HeadMask.from_kept([[3], [0, 1, 3]], [4, 4])]


def _x():
    return torch.randn(4, 1, 16, 16, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("mode", ["average", "grouped", "pruned"])
def test_hydra_round_trip(tmp_path, mode):
    fused = build_hydra(make_vit(), MASKS, mlp_mode=mode).eval()
    export_model(fused, tmp_path / "exp", MASKS, class_names=list("abcdefgh"))
    loaded = compressor.load(tmp_path / "exp")
    assert torch.equal(loaded(_x()).member_logits, fused(_x()).member_logits)
    cfg = json.loads((tmp_path / "exp" / "config.json").read_text())
    assert cfg["kind"] == "hydra" and cfg["members"] == 2 and cfg["mlp_mode"] == mode
    assert cfg["masks"][1]["kept"] == [[3], [0, 1, 3]] and "torch" in cfg["versions"]
    assert compressor.load_masks(tmp_path / "exp" / "masks.json") == MASKS
    assert loaded.class_names == list("abcdefgh")


def test_plain_round_trip(tmp_path):
    pruned = prune_physically(make_vit(), MASKS[0])
    export_model(pruned, tmp_path / "exp", MASKS[:1])
    loaded = compressor.load(tmp_path / "exp")
    assert torch.equal(loaded(_x()).member_logits[0], pruned(_x()))  # one member: the plain model's logits
    assert [b.attn.num_heads for b in loaded.model.blocks] == [2, 1]


def _rehash(folder):
    """What an editor who knows the format does: config.json's weights hash and the manifest rewritten."""
    cfg = json.loads((folder / "config.json").read_text())
    cfg["weights_sha256"] = file_sha256(folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(cfg))
    write_manifest(folder)


def test_corrupt_or_mismatched_weights(tmp_path):
    pruned = prune_physically(make_vit(), MASKS[0])
    export_model(pruned, tmp_path / "exp")
    weights = tmp_path / "exp" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ExportError, match="model.safetensors: sha256 differs from manifest.json"):
        compressor.load(tmp_path / "exp")
    _rehash(tmp_path / "exp")  # config and manifest re-hashed: the file itself is still checked
    with pytest.raises(WeightsError, match="model.safetensors: not a valid safetensors file"):
        compressor.load(tmp_path / "exp")
    weights.write_bytes(b"\x80\x04\x95 pickled code is never unpickled")
    _rehash(tmp_path / "exp")
    with pytest.raises(WeightsError, match="not a valid safetensors file"):
        compressor.load(tmp_path / "exp")
    export_model(pruned, tmp_path / "exp")
    cfg = json.loads((tmp_path / "exp" / "config.json").read_text())
    cfg["heads"] = [4, 4]
    (tmp_path / "exp" / "config.json").write_text(json.dumps(cfg))
    write_manifest(tmp_path / "exp")
    with pytest.raises(WeightsError, match=r"weights do not fit the model \(6 shapes differ: blocks.0.attn.qkv.weight"):
        compressor.load(tmp_path / "exp")
    with pytest.raises(ExportError, match="no such export folder"):
        compressor.load(tmp_path / "nothing")


def test_interrupted_export_leaves_the_previous_export_intact(tmp_path):
    """Kill a process in the middle of writing the export: the old folder must survive whole."""
    fused = build_hydra(make_vit(), MASKS, mlp_mode="grouped").eval()
    export_model(fused, tmp_path / "exp", MASKS)
    before = (tmp_path / "exp" / "model.safetensors").read_bytes()
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        sys.path.insert(0, {str(tmp_path)!r})
        import compressor.core.weights as w
        from tests.conftest import make_vit
        from tests.test_export import MASKS
        from mergers.hydra import build_hydra
        from compressor.deploy.export import export_model
        real = w.save_file
        def slow_save(tensors, path, metadata=None):
            real(tensors, path, metadata=metadata)
            print("written", flush=True)
            time.sleep(60)
        w.save_file = slow_save
        export_model(build_hydra(make_vit(seed=1), MASKS), {str(tmp_path / "exp")!r}, MASKS)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    assert proc.stdout.readline().strip() == "written"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (tmp_path / "exp" / "model.safetensors").read_bytes() == before
    assert torch.equal(compressor.load(tmp_path / "exp")(_x()).member_logits, fused(_x()).member_logits)


def test_onnx_export_of_fused_model_matches_torch(tmp_path):
    """The optional ONNX export of a fused Hydra ViT, checked with onnxruntime against torch."""
    import onnxruntime as ort

    from compressor.deploy.onnx_export import export_onnx

    vit = make_vit()
    fused = build_hydra(
        vit, [HeadMask.from_kept([[0, 1], [2]], [4, 4]), HeadMask.from_kept([[3], [0, 1]], [4, 4])], mlp_mode="grouped"
    ).eval()
    x = torch.randn(3, 1, 16, 16)
    export_onnx(fused, x, tmp_path / "m.onnx")  # raises if onnxruntime disagrees with torch
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x5 = torch.randn(5, 1, 16, 16)  # another batch size: the batch axis is dynamic
    got = sess.run(None, {"inputs": x5.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got[0]), fused(x5).member_logits, rtol=1e-4, atol=1e-4)
