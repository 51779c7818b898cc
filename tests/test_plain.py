"""The plain merger: a physically smaller model that equals the head-masked one."""

import copy

import pytest
import torch

from compressor.core.masks import HeadMask, MaskError
from compressor.families import family_of
from mergers.plain import PlainMerger, prune_physically

from .conftest import make_vit


def test_physically_pruned_equals_masked(vit_shape):
    vit = make_vit(vit_shape)
    adapter = family_of(vit)
    heads = adapter.heads_per_block()
    kept = [[0, h - 1] if b % 2 == 0 else [1] for b, h in enumerate(heads)]
    mask = HeadMask.from_kept(kept, heads)
    pruned = PlainMerger().merge(vit, [mask])
    masked = copy.deepcopy(vit)
    family_of(masked).apply_mask(mask)
    x = torch.randn(5, 1, 16, 16)
    torch.testing.assert_close(pruned(x), masked(x), rtol=1e-5, atol=1e-5)
    assert [b.attn.num_heads for b in pruned.blocks] == [len(k) for k in kept]
    assert not any(hasattr(b.attn.proj, "head_gate") for b in pruned.blocks), "no hooks left: plain timm"
    n_before = sum(p.numel() for p in vit.parameters())
    assert sum(p.numel() for p in pruned.parameters()) < n_before
    # the result is a plain timm model: its state dict loads into a freshly built timm model
    assert type(pruned) is type(vit)


def test_pruning_a_gated_member_drops_its_gates():
    vit = make_vit()
    mask = HeadMask.from_kept([[0, 1], [2]], [4, 4])
    member = copy.deepcopy(vit)
    family_of(member).apply_mask(mask)
    pruned = prune_physically(member, mask)
    x = torch.randn(3, 1, 16, 16)
    torch.testing.assert_close(pruned(x), member(x), rtol=1e-5, atol=1e-5)


def test_plain_refuses_empty_blocks():
    vit = make_vit()
    with pytest.raises(MaskError, match="block 1 keeps no head"):
        PlainMerger().merge(vit, [HeadMask.from_kept([[0], []], [4, 4])])
