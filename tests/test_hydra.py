"""The central test: a fused Hydra model's per-member logits equal each member run on its own."""

import copy

import pytest
import torch

from compressor.core.masks import HeadMask
from compressor.families import family_of
from mergers.hydra import HydraMerger, build_hydra

from .conftest import make_vit, perturbed_members

RTOL, ATOL = 1e-5, 1e-5


def random_masks(vit, members=3, seed=0, allow_empty=False):
    """Masks with unequal head counts per member (and per block)."""
    g = torch.Generator().manual_seed(seed)
    heads = family_of(vit).heads_per_block()
    masks = []
    for m in range(members):
        blocks = []
        for b, h in enumerate(heads):
            k = 1 + (m + b) % h if not (allow_empty and m == 1 and b == 0) else 0
            keep = torch.zeros(h, dtype=torch.bool)
            keep[torch.randperm(h, generator=g)[:k]] = True
            blocks.append(keep)
        masks.append(HeadMask(tuple(blocks)))
    return masks


def masked(model, mask):
    ref = copy.deepcopy(model)
    family_of(ref).apply_mask(mask)
    return ref


def with_mlp_units(model, kept_per_block):
    """Zero the output weights of every MLP unit not kept: the independent reference for 'pruned'."""
    ref = copy.deepcopy(model)
    for blk, kept in zip(ref.blocks, kept_per_block):
        drop = torch.ones(blk.mlp.fc1.out_features, dtype=torch.bool)
        drop[kept] = False
        with torch.no_grad():
            blk.mlp.fc2.weight[:, drop] = 0
    return ref


def with_average_mlp(members):
    refs = [copy.deepcopy(m) for m in members]
    for b in range(len(refs[0].blocks)):
        for name in ("fc1", "fc2"):
            for attr in ("weight", "bias"):
                avg = torch.stack([getattr(getattr(m.blocks[b].mlp, name), attr) for m in members]).mean(0)
                for r in refs:
                    getattr(r.blocks[b].mlp, name).__getattr__(attr).data.copy_(avg)
    return refs


def assert_close(a, b):
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


def images(shape_seed=0, n=6):
    return torch.randn(n, 1, 16, 16, generator=torch.Generator().manual_seed(shape_seed))


@pytest.mark.parametrize("mode", ["average", "grouped", "pruned"])
@pytest.mark.parametrize("train_mode", [False, True])
def test_fused_equals_each_masked_member(vit_shape, mode, train_mode):
    vit = make_vit(vit_shape)
    masks = random_masks(vit, allow_empty=True)
    assert len({tuple(m.num_kept()) for m in masks}) == 3  # unequal head counts
    fused = build_hydra(vit, masks, mlp_mode=mode, calibration=[images(1)])
    refs = [masked(vit, m) for m in masks]
    if mode == "pruned":
        refs = [with_mlp_units(r, fused.mlp_kept[i]) for i, r in enumerate(refs)]
    fused.train(train_mode)
    for r in refs:
        r.train(train_mode)
    x = images()
    out = fused(x)
    for i, r in enumerate(refs):
        assert_close(out.member_logits[i], r(x))
    assert_close(out.probs, torch.stack([r(x).softmax(-1) for r in refs]).mean(0))


@pytest.mark.parametrize("mode", ["grouped", "average", "pruned"])
def test_fused_equals_fine_tuned_members(vit_shape, mode):
    vit = make_vit(vit_shape)
    masks = random_masks(vit, seed=3)
    members = perturbed_members(vit, masks, scale=0.05, seed=100)
    fused = build_hydra(vit, masks, members=members, mlp_mode=mode)
    per_member = ("stem", "head", "blocks.0.norm1", "blocks.1.norm2")
    assert not any(fused.spec.shared[k] for k in per_member), "fine-tuned members differ everywhere"
    if mode == "grouped":
        refs = members
    elif mode == "average":
        refs = with_average_mlp(members)
    else:
        refs = [with_mlp_units(m, fused.mlp_kept[i]) for i, m in enumerate(members)]
    x = images(2)
    out = fused(x)
    for i, r in enumerate(refs):
        assert_close(out.member_logits[i], r(x))


def test_gradients_match_members(vit_shape):
    vit = make_vit(vit_shape)
    masks = random_masks(vit, seed=4)
    members = perturbed_members(vit, masks, scale=0.05, seed=100)
    fused = build_hydra(vit, masks, members=members, mlp_mode="grouped").train()
    w = torch.randn(vit.num_classes)
    x = images(5).requires_grad_(True)
    (fused(x).member_logits * w).sum().backward()
    ref_grad = torch.zeros_like(x)
    for m in members:
        xr = x.detach().clone().requires_grad_(True)
        (m.train()(xr) * w).sum().backward()
        ref_grad += xr.grad
    assert_close(x.grad, ref_grad)
    for i, m in enumerate(members):
        assert_close(fused.heads[i].head.weight.grad, m.head.weight.grad)
    # padded (non-existent) weights get no gradient
    qkv = fused.blocks[0].attn.qkv
    if qkv.padded:
        assert float((qkv.weight.grad * (1 - qkv.weight_mask)).abs().max()) == 0.0


def test_full_mask_member_reproduces_base(vit_shape):
    vit = make_vit(vit_shape)
    full = HeadMask.full(family_of(vit).heads_per_block())
    fused = build_hydra(vit, [full, random_masks(vit)[0]], mlp_mode="average")
    x = images(7)
    assert_close(fused(x).member_logits[0], vit(x))


def test_training_step_keeps_members_separate():
    vit = make_vit("tiny_cls")
    masks = random_masks(vit, seed=6)
    fused = HydraMerger(mlp="grouped").merge(vit, masks).train()
    opt = torch.optim.AdamW(fused.parameters(), lr=1e-2, weight_decay=0.1)
    x, y = images(8), torch.randint(0, 8, (6,))
    loss = torch.nn.functional.cross_entropy(fused(x).member_logits.flatten(0, 1), y.repeat(3))
    loss.backward()
    opt.step()
    for layer in (fused.blocks[0].attn.qkv, fused.blocks[0].attn.proj):
        if layer.padded:
            assert float((layer.weight * (1 - layer.weight_mask)).abs().max()) == 0.0


def test_compile_export_and_no_grad():
    vit = make_vit("tiny_cls")
    fused = build_hydra(vit, random_masks(vit), mlp_mode="pruned").eval()
    x = images(9)
    with torch.no_grad():
        ref = fused(x).member_logits
    compiled = torch.compile(fused, backend="aot_eager")
    with torch.no_grad():
        assert_close(compiled(x).member_logits, ref)
    exported = torch.export.export(fused, (x,))
    assert_close(exported.module()(x).member_logits, ref)


def count_calls(module: torch.nn.Module) -> list[int]:
    calls = [0]
    module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("mode", ["average", "grouped", "pruned"])
def test_chunked_cpu_inference_equals_members(mode):
    """Inference in batch chunks (the CPU fast path) gives every member's own logits."""
    vit = make_vit("small_avg")
    masks = random_masks(vit, seed=8)
    fused = build_hydra(vit, masks, mlp_mode=mode, calibration=[images(1)]).eval()
    refs = [masked(vit, m) for m in masks]
    if mode == "pruned":
        refs = [with_mlp_units(r, fused.mlp_kept[i]) for i, r in enumerate(refs)]
    per_sample = fused.stems[0].tokens_per_sample(images()) * fused._widest * 4
    fused.inference_chunk_bytes = 2 * per_sample  # two samples at a time
    calls = count_calls(fused.blocks[0])
    x = images(10, n=5)
    with torch.no_grad():
        out = fused(x)
        assert calls[0] == 3, "5 samples in chunks of 2"
        for i, r in enumerate(refs):
            assert_close(out.member_logits[i], r(x))
    fused(x)  # autograd on: one whole batch
    assert calls[0] == 4


def test_grouped_linear_inference_path_equals_batched_and_reference():
    """The CPU inference path (one GEMM per member) equals baddbmm and each member's own Linear."""
    from mergers.hydra.layers import GroupedLinear, _use_member_gemms

    torch.manual_seed(0)
    layer = GroupedLinear([64, 64, 64], [96, 80, 96])  # unequal groups: padded
    refs = [torch.nn.Linear(64, o) for o in (96, 80, 96)]
    for m, r in enumerate(refs):
        layer.set_member(m, r.weight, r.bias)
    x = torch.randn(3, 2048, 64)
    batched = layer(x)  # grad enabled: baddbmm
    with torch.no_grad():
        assert _use_member_gemms(x, layer.weight)
        per_member = layer(x)
    assert_close(per_member, batched)
    for m, r in enumerate(refs):
        assert_close(batched[m, :, : r.out_features], r(x[m]))
        assert float(batched[m, :, r.out_features :].abs().sum()) == 0.0


@pytest.mark.parametrize("bias", [True, False])
def test_grouped_linear_folds_a_member_affine_exactly(bias):
    """A norm's per-member affine folded into the weights gives the same outputs and the same
    gradients (for the affine, the weights and the input) as applying it first, padding included."""
    from mergers.hydra.layers import GroupedLinear, MemberAffine, _use_member_gemms

    torch.manual_seed(0)
    layer = GroupedLinear([48, 48, 48], [40, 24, 40], bias=bias)  # unequal outputs: padded
    affine = MemberAffine(3, 48, bias=bias)
    with torch.no_grad():
        for p in [*layer.parameters(), *affine.parameters()]:
            p.normal_()
        layer.weight.mul_(layer.weight_mask)
    x = torch.randn(3, 20, 48, requires_grad=True)
    ref_layer, ref_affine = copy.deepcopy(layer), copy.deepcopy(affine)
    x_ref = x.detach().clone().requires_grad_(True)
    folded, applied = layer(x, in_affine=affine), ref_layer(ref_affine(x_ref))
    assert_close(folded, applied)
    w = torch.randn_like(folded)
    (folded * w).sum().backward()
    (applied * w).sum().backward()
    assert_close(x.grad, x_ref.grad)
    for a, b in [(layer, ref_layer), (affine, ref_affine)]:
        for p, q in zip(a.parameters(), b.parameters()):
            assert_close(p.grad, q.grad)
    big = torch.randn(3, 2200, 48)
    with torch.no_grad():  # the CPU inference path (one GEMM per member) folds the same way
        assert _use_member_gemms(big, layer.weight)
        assert_close(layer(big, in_affine=affine), ref_layer(ref_affine(big)))


@pytest.mark.parametrize("shape", ["qk_norm", "registers"])
@pytest.mark.parametrize("mode", ["average", "grouped", "pruned"])
def test_qk_norm_and_register_tokens_fuse_exactly(shape, mode):
    """timm ViTs with qk_norm=True, and with reg_tokens=4 (plus attention pooling): the fused
    model equals each masked member, and the part under test really matters."""
    vit = make_vit(shape)
    with torch.no_grad():  # larger weights: attention far from uniform, so every part shows
        for p in vit.parameters():
            if p.dim() >= 2:
                p.mul_(3)
    masks = random_masks(vit, seed=11)
    fused = build_hydra(vit, masks, mlp_mode=mode, calibration=[images(1)]).eval()
    refs = [masked(vit, m) for m in masks]
    if mode == "pruned":
        refs = [with_mlp_units(r, fused.mlp_kept[i]) for i, r in enumerate(refs)]
    x = images(12)
    with torch.no_grad():
        out = fused(x).member_logits
        for i, r in enumerate(refs):
            assert_close(out[i], r(x))
        if shape == "qk_norm":
            for blk in fused.blocks:
                blk.attn.q_norm = torch.nn.Identity()
        else:
            fused.stems[0].reg_token.zero_()
        assert float((fused(x).member_logits - out).abs().max()) > 1e-3, "the fused model must use it"


def test_flops_counted_for_an_attention_pool_head():
    """timm's attention-pool head (its latent parameter enters a submodule as input) once broke
    FlopCounterMode under no_grad; the count equals the one taken with autograd on, parameters intact."""
    from torch.utils.flop_counter import FlopCounterMode

    from compressor.uq.evaluate import flops_per_sample

    vit = make_vit("registers")
    x = images(0, n=4)
    with FlopCounterMode(display=False) as counter:
        vit(x)
    assert flops_per_sample(vit, x) == counter.get_total_flops() / 4
    assert all(p.requires_grad for p in vit.parameters())
