"""The shared trunk: members whose first k blocks are the base's, whole and identical, fuse into a
model that runs those blocks once on one stream; its member logits still equal each member run alone."""

import copy

import pytest
import torch

import compressor
from compressor.core.masks import HeadMask
from compressor.deploy.export import export_model
from compressor.families import family_of
from compressor.uq.evaluate import flops_per_sample
from mergers.hydra import build_hydra

from .conftest import make_vit
from .test_hydra import assert_close, images, random_masks, with_average_mlp, with_mlp_units


def trunk_masks(masks: list[HeadMask], k: int) -> list[HeadMask]:
    return [m.with_whole_blocks(k) for m in masks]


def tuned_above_trunk(model: torch.nn.Module, masks: list[HeadMask], k: int, scale: float = 0.05) -> list:
    """Stand-ins for members fine-tuned with the trunk frozen: every parameter of blocks k.. and of
    the classifier nudged by seeded noise (members differ there), the embeddings and blocks < k untouched."""
    out = []
    for i, mask in enumerate(masks):
        torch.manual_seed(100 + i)
        member = copy.deepcopy(model)
        family = family_of(member)
        tuned = [p for block in family.blocks()[k:] for p in block.parameters()] + list(
            family.classifier().parameters()
        )
        with torch.no_grad():
            for p in tuned:
                p.add_(scale * torch.randn_like(p))
        family.apply_mask(mask)
        out.append(member)
    return out


def references(members: list, fused, mode: str) -> list:
    """Each member on its own, as the fused model's MLP mode defines it."""
    if mode == "average":
        return with_average_mlp(members)
    if mode == "pruned":
        return [with_mlp_units(m, fused.mlp_kept[i]) for i, m in enumerate(members)]
    return members


def flops(model: torch.nn.Module, x: torch.Tensor) -> float:
    return flops_per_sample(model, x)


@pytest.mark.parametrize("mode", ["average", "grouped", "pruned"])
def test_trunk_fuses_exactly_and_runs_once(vit_shape, mode):
    vit = make_vit(vit_shape)
    masks = trunk_masks(random_masks(vit, seed=5), 1)
    members = tuned_above_trunk(vit, masks, 1)
    fused = build_hydra(vit, masks, members=members, mlp_mode=mode).eval()
    assert fused.spec.trunk == 1 and fused.spec.heads[0] == [family_of(vit).num_heads(0)]
    x = images(3)
    out = fused(x).member_logits
    for i, ref in enumerate(references(members, fused, mode)):
        assert_close(out[i], ref(x))
    # the same members with their first block tuned too: no trunk, and more FLOPs
    untied = tuned_above_trunk(vit, masks, 0)
    plain = build_hydra(vit, masks, members=untied, mlp_mode=mode).eval()
    assert plain.spec.trunk == 0
    assert flops(fused, x) < flops(plain, x)
    assert sum(p.numel() for p in fused.parameters()) < sum(p.numel() for p in plain.parameters())


def test_trunk_stops_at_the_first_block_members_differ_in():
    vit = make_vit("small_avg")  # 3 blocks
    masks = trunk_masks(random_masks(vit, seed=2), 2)
    members = tuned_above_trunk(vit, masks, 2)
    assert build_hydra(vit, masks, members=members).spec.trunk == 2
    with torch.no_grad():
        family_of(members[1]).blocks()[1].norm1.weight.add_(0.01)  # member 1's block 1 differs
    fused = build_hydra(vit, masks, members=members)
    assert fused.spec.trunk == 1
    for i, ref in enumerate(with_average_mlp(members)):
        assert_close(fused(images(1)).member_logits[i], ref(images(1)))
    whole = [HeadMask.full(family_of(vit).heads_per_block())] * 3  # never the last block: members must differ
    assert build_hydra(vit, whole).spec.trunk == 2


def test_merger_chosen_mlp_units_leave_the_trunk_whole():
    vit = make_vit("tiny_cls")
    masks = trunk_masks(random_masks(vit, seed=1), 1)
    fused = build_hydra(vit, masks, mlp_mode="pruned", calibration=[images(4)])
    width = family_of(vit).mlp_widths()[0]
    assert fused.spec.trunk == 1 and fused.spec.mlp_hidden[0] == [width]
    assert all(len(units[1]) < width for units in fused.mlp_kept)  # the other blocks cut to 1/M per member
    for i, ref in enumerate(references([vit] * 3, fused, "pruned")):
        family_of(ref).apply_mask(masks[i])
        assert_close(fused(images(2)).member_logits[i], ref(images(2)))


@pytest.mark.parametrize("mode", ["average", "pruned"])
def test_trunk_export_round_trip(tmp_path, mode):
    vit = make_vit("small_avg")
    masks = trunk_masks(random_masks(vit, seed=4), 2)
    fused = build_hydra(vit, masks, tuned_above_trunk(vit, masks, 2), mlp_mode=mode, calibration=[images(4)]).eval()
    export_model(fused, tmp_path / "exp", masks)
    loaded = compressor.load(tmp_path / "exp")
    assert loaded.model.spec.trunk == 2
    assert torch.equal(loaded(images(5)).member_logits, fused(images(5)).member_logits)


def test_minilm_trunk_of_three_blocks_equals_members():
    from transformers import AutoModel

    from compressor.data.text import minilm_path
    from compressor.families.classifiers import MeanPoolClassifier

    torch.manual_seed(0)
    model = MeanPoolClassifier(AutoModel.from_pretrained(str(minilm_path())), 3).eval()
    g = torch.Generator().manual_seed(2)
    masks = [
        HeadMask.from_kept([torch.randperm(12, generator=g)[:6].tolist() for _ in range(6)], [12] * 6) for _ in range(3)
    ]
    masks = trunk_masks(masks, 3)
    members = tuned_above_trunk(model, masks, 3, scale=0.02)
    fused = build_hydra(model, masks, members=members, mlp_mode="average").eval()
    assert fused.spec.trunk == 3
    ids = torch.randint(1000, 5000, (4, 12), generator=g)
    ids[2, 8:] = 0  # padding: the key mask reaches the trunk and the member blocks alike
    with torch.no_grad():
        out = fused(ids).member_logits
        for i, ref in enumerate(with_average_mlp_hf(members)):
            torch.testing.assert_close(out[i], ref(ids), rtol=1e-5, atol=1e-5)


def with_average_mlp_hf(members: list) -> list:
    """Copies of the members whose MLP weights are the members' average, through the family layer."""
    refs = [copy.deepcopy(m) for m in members]
    fams = [family_of(r) for r in refs]
    with torch.no_grad():
        for b in range(fams[0].num_blocks):
            for slot in ("fc1", "fc2"):
                layers = [getattr(f.mlp(b), slot).get() for f in fams]
                for attr in ("weight", "bias"):
                    avg = torch.stack([getattr(layer, attr) for layer in layers]).mean(0)
                    for layer in layers:
                        getattr(layer, attr).copy_(avg)
    return refs


def test_member_fine_tunes_freeze_the_trunk_and_the_merge_shares_it(tmp_path):
    """prune.shared_blocks: 1 -> each member's fine-tune leaves the embeddings and block 0 as the
    base's (and trains the rest); the merge then runs block 0 once."""
    from torch.utils.data import TensorDataset

    from compressor.core.registry import resolve
    from compressor.data import DataBundle
    from compressor.run.context import RunContext
    from compressor.run.recipe import validate_recipe

    raw = {
        "name": "trunk",
        "model": {"name": "vit_tiny_patch16_224"},
        "steps": [
            {"prune": {"pruner": "random", "members": 2, "shared_blocks": 1}},
            {"finetune": {"target": "members", "steps": 3, "lr": 1e-2}},
            {"merge": {"merger": "hydra", "mlp": "average"}},
        ],
    }
    recipe = validate_recipe(raw)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 1, 16, 16, generator=g), torch.randint(0, 8, (64,), generator=g))
    base = make_vit("tiny_cls")
    masks = trunk_masks([HeadMask.from_kept([[0], [1, 2]], [4, 4]), HeadMask.from_kept([[3], [0]], [4, 4])], 1)
    ctx = RunContext(recipe=recipe, out=tmp_path, data=DataBundle(train=data, val=data, test=data), base=base)
    ctx.masks, ctx.shared_blocks = masks, 1
    resolve("step", "finetune").run(ctx, recipe.steps[1][1])
    for member in ctx.members:
        assert torch.equal(member.blocks[0].attn.qkv.weight, base.blocks[0].attn.qkv.weight)
        assert torch.equal(member.pos_embed, base.pos_embed)
        assert not torch.equal(member.blocks[1].mlp.fc1.weight, base.blocks[1].mlp.fc1.weight)
        assert all(p.requires_grad for p in member.parameters()), "frozen only during the fine-tune"
    resolve("step", "merge").run(ctx, recipe.steps[2][1])
    assert ctx.merged.spec.trunk == 1
    ctx.shared_blocks = 2  # asked for more than the members share: the merge says so
    with pytest.raises(compressor.core.errors.InputError, match="prune.shared_blocks is 2 but"):
        resolve("step", "merge").run(ctx, recipe.steps[2][1])
