"""Exports that their own library loads without compressor: a plain timm export rebuilt with timm
and torch alone (examples/standalone_timm.py, run in a process that never imports compressor), and a
MiniLM export read with transformers alone (examples/standalone_hf.py: encoder, tokenizer,
mean-pool head and the stored temperature)."""

import subprocess
import sys
import textwrap

import torch
from safetensors.torch import save_file

import compressor
from compressor.core.masks import HeadMask
from compressor.data import digits_bundle
from compressor.deploy.export import export_model
from compressor.families import family_of
from compressor.surgery.mlp_units import with_top_units
from compressor.uq.calibrated import Calibrated
from mergers.plain import prune_physically

from .conftest import make_vit
from .helpers import ROOT

NO_COMPRESSOR = "assert not any(m == 'compressor' or m.startswith('compressor.') for m in sys.modules), 'imported'\n"


def _run_alone(script: str, cwd) -> subprocess.CompletedProcess:
    """Python in a fresh process whose path does not reach this repository."""
    return subprocess.run([sys.executable, "-I", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_plain_timm_export_rebuilds_with_timm_alone(tmp_path):
    for shape in ("small_avg", "qk_norm"):
        vit = make_vit(shape)
        family = family_of(vit)
        heads = family.heads_per_block()
        mask = HeadMask.from_kept([list(range(0, h, 2)) for h in heads], heads)
        mask = with_top_units(family, [mask], 0.5, [torch.randn(8, 1, 16, 16)])[0]
        pruned = prune_physically(vit, mask)
        folder = tmp_path / shape
        calibrated = Calibrated(pruned, 1.7, {})  # a plain export after the calibrate step
        export_model(calibrated, folder, [mask], preprocessing=digits_bundle().preprocessing)
        loaded = compressor.load(folder)
        x = torch.randn(3, 1, 16, 16)
        with torch.no_grad():
            out = loaded(x)
            y, probs = out.member_logits[0], out.probs
        torch.testing.assert_close(y, pruned(x))
        save_file({"x": x, "y": y, "probs": probs.float()}, str(tmp_path / f"{shape}.safetensors"))
        data_cfg = dict(loaded.preprocessing)
        snippet = (ROOT / "examples" / "standalone_timm.py").read_text()  # the README's example
        snippet = snippet.replace('"runs/vit_prune/export"', repr(str(folder)))
        check = textwrap.dedent(f"""
            import sys
            import torch
            from safetensors.torch import load_file
            ref = load_file({str(tmp_path / f"{shape}.safetensors")!r})
            with torch.no_grad():
                out = model(ref["x"])
            torch.testing.assert_close(out, ref["y"], rtol=1e-5, atol=1e-5)
            with torch.no_grad():
                torch.testing.assert_close(calibrated_probs(ref["x"]), ref["probs"], rtol=1e-5, atol=1e-5)
            import timm.data
            data_cfg = timm.data.resolve_data_config({{}}, model=model)
            assert list(data_cfg["input_size"]) == {data_cfg["input_size"]!r}, data_cfg
            assert data_cfg["crop_pct"] == {data_cfg.get("crop_pct")!r}
            assert list(data_cfg["mean"]) == {data_cfg["mean"]!r}
            assert [b.attn.num_heads for b in model.blocks] == {family_of(pruned).heads_per_block()}
            assert [b.mlp.fc1.out_features for b in model.blocks] == {family_of(pruned).mlp_widths()}
        """)
        result = _run_alone(snippet + check + NO_COMPRESSOR, tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]


def test_minilm_export_reads_with_transformers_alone(tmp_path):
    """The README's text snippet (encoder, tokenizer and mean-pool head from hf_encoder/, the stored
    temperature), run with transformers only, gives compressor.load's calibrated probabilities."""
    from transformers import AutoModel, AutoTokenizer

    from compressor.data.text import minilm_path
    from compressor.families.classifiers import MeanPoolClassifier

    torch.manual_seed(0)
    path = str(minilm_path())
    tok = AutoTokenizer.from_pretrained(path)
    model = MeanPoolClassifier(AutoModel.from_pretrained(path), 2, tok.pad_token_id).eval()
    mask = HeadMask.from_kept([[m, m + 4, 11 - m] for m in range(6)], [12] * 6)
    pruned = prune_physically(model, mask)
    export_model(
        Calibrated(pruned, 1.3, {}),
        tmp_path / "exp",
        [mask],
        ["rotten", "fresh"],
        preprocessing={"kind": "text", "tokenizer": path, "max_length": 16},
    )
    sentences = ["a quiet triumph", "dull and far too long, with nothing to say"]
    ids = tok(sentences, padding="max_length", truncation=True, max_length=16, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        probs = compressor.load(tmp_path / "exp")(ids).probs
    assert not torch.allclose(probs, pruned(ids).softmax(-1).double(), atol=1e-3), "the temperature must matter"
    save_file({"probs": probs.float()}, str(tmp_path / "expected.safetensors"))
    snippet = (ROOT / "examples" / "standalone_hf.py").read_text()  # the README's example
    snippet = snippet.replace('"runs/my_text/export"', repr(str(tmp_path / "exp")))
    check = textwrap.dedent(f"""
        import sys
        import torch
        expected = load_file({str(tmp_path / "expected.safetensors")!r})["probs"]
        with torch.no_grad():
            torch.testing.assert_close(calibrated_probs({sentences!r}), expected, rtol=1e-5, atol=1e-5)
        assert tok.vocab_size > 30000, "the real vocabulary, not a stub"
    """)
    result = _run_alone(snippet + check + NO_COMPRESSOR, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


def test_uniformly_pruned_hf_vit_exports_smaller_and_reloads_with_transformers(tmp_path):
    from transformers import ViTForImageClassification

    from .test_hf import _hf_classifier, _hf_inputs

    model = _hf_classifier("vit")
    x = _hf_inputs("vit")
    mask = HeadMask.from_kept([[0, 2], [1, 3]], [4, 4]).with_units([list(range(0, 64, 2))] * 2, [64, 64])
    pruned = prune_physically(model, mask)
    export_model(pruned, tmp_path / "e", [mask])
    alone = ViTForImageClassification.from_pretrained(str(tmp_path / "e" / "hf_model")).eval()
    with torch.no_grad():
        torch.testing.assert_close(alone(x).logits, pruned(x).logits, rtol=1e-5, atol=1e-5)
    assert sum(p.numel() for p in alone.parameters()) == sum(p.numel() for p in pruned.parameters())
    assert sum(p.numel() for p in alone.parameters()) < sum(p.numel() for p in model.parameters())


def test_unevenly_pruned_minilm_keeps_zero_weights_for_transformers(tmp_path):
    """BERT cannot describe different sizes per layer: the transformers copy holds zeros for the
    removed heads and MLP units and still gives the pruned model's outputs."""
    from transformers import AutoModel

    from compressor.data.text import minilm_path
    from compressor.families.classifiers import MeanPoolClassifier

    model = MeanPoolClassifier(AutoModel.from_pretrained(str(minilm_path())), 2).eval()
    heads = [list(range(12 - b)) for b in range(6)]
    mask = HeadMask.from_kept(heads, [12] * 6).with_units([list(range(0, 1536, 1 + b)) for b in range(6)], [1536] * 6)
    pruned = prune_physically(model, mask)
    export_model(pruned, tmp_path / "e", [mask])
    encoder = AutoModel.from_pretrained(str(tmp_path / "e" / "hf_encoder")).eval()
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102, 0, 0]])
    with torch.no_grad():
        ours = pruned.encoder(input_ids=ids, attention_mask=(ids != 0).long()).last_hidden_state
        theirs = encoder(input_ids=ids, attention_mask=(ids != 0).long()).last_hidden_state
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
