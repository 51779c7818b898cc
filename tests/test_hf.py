"""HF transformers adapter on the real all-MiniLM-L6-v2 (BERT, 6 layers x 12 heads), offline."""

import copy

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from compressor.core.masks import HeadMask
from compressor.core.registry import resolve
from compressor.data.text import minilm_path
from compressor.families import Bert, family_of
from compressor.families.classifiers import MeanPoolClassifier
from mergers.plain import prune_physically

from .conftest import perturbed_members

SENTENCES = [
    "a gripping, beautifully acted film",
    "dull and far too long",
    "the best thing i have seen this year",
    "an incoherent mess",
    "warm, funny and wise",
    "i wanted my two hours back",
    "a quiet triumph",
    "painfully predictable",
]
LABELS = torch.tensor([1, 0, 1, 0, 1, 0, 1, 0])


@pytest.fixture(scope="module")
def minilm():
    torch.manual_seed(0)
    encoder = AutoModel.from_pretrained(str(minilm_path()))
    tok = AutoTokenizer.from_pretrained(str(minilm_path()))
    ids = tok(SENTENCES, padding=True, return_tensors="pt")["input_ids"]
    return MeanPoolClassifier(encoder, 2).eval(), ids


def test_adapter_sees_minilm_heads(minilm):
    model, _ = minilm
    adapter = family_of(model)
    assert isinstance(adapter, Bert)
    assert adapter.heads_per_block() == [12] * 6 and adapter.head_dim(0) == 32


def test_gates_change_the_output_and_zero_gates_equal_removed_heads(minilm):
    model, ids = minilm
    ref = model(ids)
    mask = HeadMask.from_kept([list(range(0, 12, 2))] * 3 + [[1, 5, 7]] * 3, [12] * 6)
    masked = copy.deepcopy(model)
    family_of(masked).apply_mask(mask)
    out_masked = masked(ids)
    assert (out_masked - ref).abs().max() > 1e-3, "gating must have an effect (head_mask alone does not)"
    pruned = prune_physically(model, mask)
    torch.testing.assert_close(pruned(ids), out_masked, rtol=1e-5, atol=1e-5)
    assert [a.num_attention_heads for a in (layer.attention.self for layer in pruned.encoder.encoder.layer)] == [
        6,
        6,
        6,
        3,
        3,
        3,
    ]
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(pruned) < n(model)


@pytest.mark.parametrize("name", ["magnitude", "taylor", "gradient_free", "random", "disjoint"])
def test_every_pruner_scores_minilm(minilm, name):
    model, ids = minilm
    data = [(ids[:4], LABELS[:4]), (ids[4:], LABELS[4:])]
    opts = {"members": 3, "seed": 0} if name == "disjoint" else {"members": 3, "keep_ratio": 0.25, "seed": 0}
    if name == "gradient_free":
        opts["diversity"] = "none"
    masks = resolve("pruner", name)(**opts).prune(family_of(model), data, data)
    assert len(set(masks)) == 3
    assert all(m.heads_per_block() == [12] * 6 for m in masks)


def _tiny_hf(kind: str):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPVisionConfig, CLIPVisionModel, ViTConfig, ViTModel

    torch.manual_seed(0)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    if kind == "vit":
        return ViTModel(ViTConfig(image_size=16, patch_size=8, num_channels=3, **common)).eval()
    if kind == "clip_vision":
        return CLIPVisionModel(CLIPVisionConfig(image_size=16, patch_size=8, **common)).eval()
    return CLIPTextModel(CLIPTextConfig(vocab_size=50, max_position_embeddings=16, **common)).eval()


@pytest.mark.parametrize("kind", ["vit", "clip_vision", "clip_text"])
def test_vit_and_clip_towers(kind):
    model = _tiny_hf(kind)
    x = torch.randint(0, 50, (2, 7)) if kind == "clip_text" else torch.randn(2, 3, 16, 16)
    adapter = family_of(model)
    assert adapter.heads_per_block() == [4, 4]
    mask = HeadMask.from_kept([[0, 3], [2]], [4, 4])
    masked = copy.deepcopy(model)
    family_of(masked).apply_mask(mask)
    ref = adapter.logits(x)
    out = family_of(masked).logits(x)
    assert (out - ref).abs().max() > 1e-4
    pruned = prune_physically(model, mask)
    torch.testing.assert_close(family_of(pruned).logits(x), out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["average", "grouped", "pruned"])
def test_hydra_minilm_equals_masked_members(minilm, mode):
    from mergers.hydra import HydraMerger

    model, ids = minilm
    heads = [12] * 6
    g = torch.Generator().manual_seed(1)
    masks = [
        HeadMask.from_kept([torch.randperm(12, generator=g)[: 2 + 3 * m + b % 2].tolist() for b in range(6)], heads)
        for m in range(3)
    ]
    fused = HydraMerger(mlp=mode).merge(model, masks)
    out = fused(ids).member_logits
    for i, mask in enumerate(masks):
        ref = copy.deepcopy(model)
        family_of(ref).apply_mask(mask)
        if mode == "pruned":
            for layer, kept in zip(ref.encoder.encoder.layer, fused.mlp_kept[i]):
                drop = torch.ones(layer.output.dense.in_features, dtype=torch.bool)
                drop[kept] = False
                with torch.no_grad():
                    layer.output.dense.weight[:, drop] = 0
        torch.testing.assert_close(out[i], ref(ids), rtol=1e-5, atol=1e-5)


def test_hydra_minilm_fine_tuned_members(minilm):
    from mergers.hydra import HydraMerger

    model, ids = minilm
    masks = [HeadMask.from_kept([[m, m + 3, 11 - m]] * 6, [12] * 6) for m in range(3)]
    members = perturbed_members(model, masks, scale=0.02, seed=10)
    fused = HydraMerger(mlp="grouped").merge(model, masks, members)
    assert not fused.spec.shared["stem"]
    out = fused(ids).member_logits
    for i, member in enumerate(members):
        torch.testing.assert_close(out[i], member(ids), rtol=1e-5, atol=1e-5)


def test_export_round_trips_for_minilm(minilm, tmp_path):
    import compressor
    from compressor.deploy.export import export_model
    from mergers.hydra import HydraMerger

    model, ids = minilm
    masks = [HeadMask.from_kept([[m, m + 4, 11 - m]] * 6, [12] * 6) for m in range(3)]
    fused = HydraMerger(mlp="pruned").merge(model, masks)
    export_model(fused, tmp_path / "hydra", masks, ["neg", "pos"])
    loaded = compressor.load(tmp_path / "hydra")
    assert torch.equal(loaded(ids).member_logits, fused(ids).member_logits)

    pruned = prune_physically(model, masks[0])
    export_model(pruned, tmp_path / "plain", masks[:1])
    again = compressor.load(tmp_path / "plain")
    assert torch.equal(again(ids).member_logits[0], pruned(ids))
    # without this project: transformers alone loads the pruned encoder (removed heads are zeros)
    encoder = AutoModel.from_pretrained(str(tmp_path / "plain" / "hf_encoder")).eval()
    mask = (ids != 0).long()
    with torch.no_grad():
        ours = pruned.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        theirs = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)


def _small_clip():
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(0)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    text = dict(vocab_size=50, max_position_embeddings=16, **common)
    return CLIPModel(CLIPConfig(text_config=text, vision_config=dict(image_size=16, patch_size=8, **common))).eval()


PROMPTS = torch.tensor([[0, 5, 9, 49], [0, 7, 3, 49], [0, 11, 49, 1], [0, 4, 4, 49]])  # 4 classes


def _hf_classifier(kind: str):
    """A small randomly initialised transformers classifier of each family the hydra merger fuses."""
    from transformers import (
        CLIPConfig,
        CLIPForImageClassification,
        CLIPTextConfig,
        CLIPTextModel,
        ViTConfig,
        ViTForImageClassification,
    )

    from compressor.families.classifiers import ZeroShotCLIP

    torch.manual_seed(0)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    if kind == "vit":
        config = ViTConfig(image_size=16, patch_size=8, num_channels=3, num_labels=5, **common)
        model = ViTForImageClassification(config)
    elif kind == "clip_vision":
        vision = dict(image_size=16, patch_size=8, **common)
        model = CLIPForImageClassification(CLIPConfig(vision_config=vision, num_labels=5))
    elif kind == "clip_zero_shot":
        model = _small_clip()
    else:
        encoder = CLIPTextModel(CLIPTextConfig(vocab_size=50, max_position_embeddings=16, **common))
        model = MeanPoolClassifier(encoder, 5, pad_token_id=1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    if kind == "clip_zero_shot":
        model = ZeroShotCLIP.from_clip(model, PROMPTS)
    return model.eval()


def _hf_inputs(kind: str) -> torch.Tensor:
    if kind != "clip_text":
        return torch.randn(3, 3, 16, 16)
    ids = torch.randint(2, 50, (3, 9))
    ids[0, 6:] = 1  # right padding, as a tokenizer pads
    ids[2, 4:] = 1
    ids[1, :2] = 1  # left padding: the first rows see no real token under the causal mask
    return ids


@pytest.mark.parametrize("mode", ["average", "grouped", "pruned"])
@pytest.mark.parametrize("kind", ["vit", "clip_vision", "clip_text", "clip_zero_shot"])
def test_hydra_hf_equals_masked_members(kind, mode, tmp_path):
    """ViT, CLIP vision (mean-pooled patches), CLIP text (causal + padding mask, quick GELU) and
    zero-shot CLIP (projection + cosine similarity to class prompt embeddings)."""
    import compressor
    from compressor.deploy.export import export_model
    from mergers.hydra import HydraMerger

    model = _hf_classifier(kind)
    masks = [HeadMask.from_kept([[0, 1, 2], [3]], [4, 4]), HeadMask.from_kept([[3], [0, 2]], [4, 4])]
    members = perturbed_members(model, masks, scale=0.02, seed=10) if mode == "grouped" else None
    fused = HydraMerger(mlp=mode).merge(model, masks, members)
    x = _hf_inputs(kind)
    out = fused(x).member_logits
    for i, mask in enumerate(masks):
        ref = members[i] if members else copy.deepcopy(model)
        family_of(ref).apply_mask(mask)
        if mode == "pruned":
            ref_family = family_of(ref)
            for b, kept in enumerate(fused.mlp_kept[i]):
                fc2 = ref_family.mlp(b).fc2.get()
                drop = torch.ones(fc2.in_features, dtype=torch.bool)
                drop[kept] = False
                with torch.no_grad():
                    fc2.weight[:, drop] = 0
        expected = family_of(ref).logits(x)
        assert (expected - family_of(model).logits(x)).abs().max() > 1e-4, "the member differs from the base"
        torch.testing.assert_close(out[i], expected, rtol=1e-5, atol=1e-5)
    fused.inference_chunk_bytes = 1  # CPU inference one sample at a time: exact too
    calls = []
    fused.blocks[0].register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        torch.testing.assert_close(fused(x).member_logits, out, rtol=1e-5, atol=1e-5)
    assert len(calls) == len(x)
    export_model(fused, tmp_path / "e", masks)
    assert torch.equal(compressor.load(tmp_path / "e")(x).member_logits, out)


def test_hydra_refuses_bare_towers_clearly():
    from mergers.hydra import HydraMerger

    model = _tiny_hf("clip_text")
    with pytest.raises(NotImplementedError, match="CLIPTextModel is not supported.*MeanPoolClassifier"):
        HydraMerger().merge(model, [HeadMask.full([4, 4])])


@pytest.mark.parametrize("name", ["magnitude", "taylor", "gradient_free", "random", "disjoint"])
@pytest.mark.parametrize("kind", ["clip_vision", "clip_text", "clip_zero_shot"])
def test_every_pruner_on_clip_classifiers(kind, name):
    model = _hf_classifier(kind)
    x = _hf_inputs(kind)
    data = [(x, torch.tensor([0, 3, 1]))]
    opts = {"members": 2, "seed": 0} if name == "disjoint" else {"members": 2, "keep_ratio": 0.5, "seed": 0}
    masks = resolve("pruner", name)(**opts).prune(family_of(model), data, data)
    assert len(set(masks)) == 2 and all(m.heads_per_block() == [4, 4] for m in masks)


def test_plain_clip_export_loads_with_transformers_alone(tmp_path):
    """A physically pruned CLIPForImageClassification: compressor.load and from_pretrained agree with it."""
    from transformers import CLIPForImageClassification

    import compressor
    from compressor.deploy.export import export_model

    model = _hf_classifier("clip_vision")
    mask = HeadMask.from_kept([[1, 2], [0]], [4, 4])
    pruned = prune_physically(model, mask)
    x = _hf_inputs("clip_vision")
    masked = copy.deepcopy(model)
    family_of(masked).apply_mask(mask)
    torch.testing.assert_close(pruned(x).logits, masked(x).logits, rtol=1e-5, atol=1e-5)
    export_model(pruned, tmp_path / "plain", [mask])
    loaded = compressor.load(tmp_path / "plain")
    assert family_of(loaded.model).heads_per_block() == [2, 1]
    assert torch.equal(loaded.model(x).logits, pruned(x).logits)
    assert torch.equal(loaded(x).member_logits[0], pruned(x).logits)
    alone = CLIPForImageClassification.from_pretrained(str(tmp_path / "plain" / "hf_model")).eval()
    with torch.no_grad():
        torch.testing.assert_close(alone(x).logits, pruned(x).logits, rtol=1e-5, atol=1e-5)


def test_zero_shot_clip_equals_clip_logits_per_image():
    """ZeroShotCLIP gives CLIPModel's own logits_per_image for the class prompts."""
    from compressor.families.classifiers import ZeroShotCLIP

    clip = _small_clip()
    x = _hf_inputs("clip_zero_shot")
    with torch.no_grad():
        expected = clip(input_ids=PROMPTS, pixel_values=x).logits_per_image
        got = ZeroShotCLIP.from_clip(clip, PROMPTS)(x)
    assert got.shape == (3, 4)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_plain_zero_shot_clip_export_round_trip(tmp_path):
    import compressor
    from compressor.deploy.export import export_model

    model = _hf_classifier("clip_zero_shot")
    mask = HeadMask.from_kept([[0, 3], [1, 2, 3]], [4, 4])
    pruned = prune_physically(model, mask)
    x = _hf_inputs("clip_zero_shot")
    masked = copy.deepcopy(model)
    family_of(masked).apply_mask(mask)
    torch.testing.assert_close(pruned(x), masked(x), rtol=1e-5, atol=1e-5)
    export_model(pruned, tmp_path / "plain", [mask])
    loaded = compressor.load(tmp_path / "plain")
    assert torch.equal(loaded(x).member_logits[0], pruned(x))
    assert (tmp_path / "plain" / "hf_encoder" / "model.safetensors").is_file()
