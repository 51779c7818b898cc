"""Shared fixtures: tiny timm ViTs and small labelled batches, all built offline in seconds."""

from __future__ import annotations

import os

import pytest
import timm
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))

VIT_SHAPES = {
    # name: timm kwargs (two shapes: class token + fused heads; avg pool + layer scale, no qkv bias)
    "tiny_cls": dict(img_size=16, patch_size=4, embed_dim=48, depth=2, num_heads=4, in_chans=1, num_classes=8),
    "small_avg": dict(
        img_size=16,
        patch_size=8,
        embed_dim=64,
        depth=3,
        num_heads=8,
        in_chans=1,
        num_classes=5,
        class_token=False,
        global_pool="avg",
        init_values=0.5,
        qkv_bias=False,
    ),
    # the hydra merger's newer cases: qk-norm (a LayerNorm over each head's q and k) and register
    # tokens (with an attention-pooling head, no class token, position embeddings without prefix)
    "qk_norm": dict(
        img_size=16, patch_size=4, embed_dim=48, depth=2, num_heads=4, in_chans=1, num_classes=8, qk_norm=True
    ),
    "registers": dict(
        img_size=16,
        patch_size=4,
        embed_dim=48,
        depth=2,
        num_heads=4,
        in_chans=1,
        num_classes=8,
        reg_tokens=4,
        class_token=False,
        no_embed_class=True,
        global_pool="map",
    ),
}


def make_vit(shape: str = "tiny_cls", seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **VIT_SHAPES[shape])
    # random (not zero) biases, norms and class/register tokens, so that every parameter matters in
    # equivalence tests
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "gamma" in name or name.endswith("_token"):
                p.add_((1.0 if name.endswith("_token") else 0.1) * torch.randn_like(p))
    return model.eval()


@pytest.fixture(params=list(VIT_SHAPES))
def vit_shape(request) -> str:
    return request.param


@pytest.fixture
def vit() -> torch.nn.Module:
    return make_vit("tiny_cls")


def labelled_batches(n_batches: int = 3, batch: int = 16, classes: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, 1, 16, 16, generator=g), torch.randint(0, classes, (batch,), generator=g))
        for _ in range(n_batches)
    ]


@pytest.fixture
def batches():
    return labelled_batches()


def perturbed_members(model: torch.nn.Module, masks, scale: float, seed: int = 0) -> list[torch.nn.Module]:
    """Stand-ins for fine-tuned members: copies of `model` with every parameter nudged by seeded
    noise (so members differ everywhere) and member i's head mask applied."""
    import copy

    from compressor.families import family_of

    out = []
    for i, mask in enumerate(masks):
        torch.manual_seed(seed + i)
        member = copy.deepcopy(model)
        with torch.no_grad():
            for p in member.parameters():
                p.add_(scale * torch.randn_like(p))
        family_of(member).apply_mask(mask)
        out.append(member)
    return out
