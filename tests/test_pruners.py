import copy

import pytest
import torch
import torch.nn.functional as F

from compressor.core.masks import MaskError
from compressor.core.registry import resolve
from compressor.families import family_of
from pruners import DisjointPruner, GradientFreePruner, MagnitudeImportance, MagnitudePruner, RandomPruner, TaylorPruner
from pruners.taylor import taylor_scores

from .conftest import labelled_batches, make_vit

ALL = ["magnitude", "taylor", "gradient_free", "random", "disjoint"]


@pytest.mark.parametrize("name", ALL)
def test_shapes_determinism_and_distinct_members(name, vit, batches):
    adapter = family_of(vit)
    opts = {"members": 3, "seed": 1} if name == "disjoint" else {"members": 3, "keep_ratio": 0.5, "seed": 1}
    masks = resolve("pruner", name)(**opts).prune(adapter, batches, batches)
    again = resolve("pruner", name)(**opts).prune(adapter, batches, batches)
    assert masks == again, "same seed must give the same masks"
    assert len(masks) == 3 and len(set(masks)) == 3, "members must differ"
    for m in masks:
        assert m.heads_per_block() == adapter.heads_per_block()
        if name != "disjoint":
            assert m.num_kept() == [2, 2]
    # pruning leaves the model un-gated
    assert all(bool((g == 1).all()) for g in adapter.install_gates())


def test_other_seed_changes_random_masks(vit):
    a = RandomPruner(members=2, seed=0).prune(family_of(vit))
    b = RandomPruner(members=2, seed=5).prune(family_of(vit))
    assert a != b


def test_disjoint_partitions_every_head():
    vit = make_vit("small_avg")  # 8 heads per block, 3 members: 3/3/2
    adapter = family_of(vit)
    for rank_by in (None, "magnitude"):
        masks = DisjointPruner(members=3, rank_by=rank_by).prune(adapter)
        for b in range(adapter.num_blocks):
            counts = torch.stack([m.blocks[b] for m in masks]).sum(0)
            assert bool((counts == 1).all()), "each head in exactly one member"
            assert sorted(m.num_kept()[b] for m in masks) == [2, 3, 3]


def test_disjoint_round_robin_follows_ranking(vit):
    adapter = family_of(vit)
    scores = MagnitudeImportance()(adapter, [], None)
    masks = DisjointPruner(members=2, rank_by="magnitude").prune(adapter)
    order = torch.argsort(-scores[0].double(), stable=True)
    assert masks[0].blocks[0][order[0]] and masks[1].blocks[0][order[1]] and masks[0].blocks[0][order[2]]


def test_taylor_matches_finite_differences():
    vit = make_vit("tiny_cls").double()
    data = [(x.double(), y) for x, y in labelled_batches(2)]
    adapter = family_of(vit)
    scores = taylor_scores(adapter, data)
    eps = 1e-5

    def loss_with(block, head, value):
        gates = [torch.ones(h, dtype=torch.float64) for h in adapter.heads_per_block()]
        gates[block][head] = value
        adapter.set_gates(gates)
        with torch.no_grad():
            return sum(float(F.cross_entropy(vit(x), y)) for x, y in data)

    for block in range(adapter.num_blocks):
        for head in range(adapter.num_heads(block)):
            fd = (loss_with(block, head, 1 + eps) - loss_with(block, head, 1 - eps)) / (2 * eps)
            assert abs(scores[block][head].item() - abs(fd)) < 1e-4 * max(1.0, abs(fd))


def test_taylor_prunes_least_important():
    vit = make_vit("tiny_cls")
    data = labelled_batches(2)
    pruner = TaylorPruner(members=1, keep_heads=1, diversity="none")
    mask = pruner.prune(family_of(vit), data)[0]
    for b, s in enumerate(pruner.last_scores[0]):
        assert mask.kept_indices(b) == [int(torch.argmax(s))]


def _manual_nll(vit, dropped: dict[int, list[int]], data) -> float:
    """NLL with heads removed by zeroing their output-projection columns (no gates involved)."""
    model = copy.deepcopy(vit)
    for b, heads in dropped.items():
        attn = model.blocks[b].attn
        with torch.no_grad():
            for h in heads:
                attn.proj.weight[:, h * attn.head_dim : (h + 1) * attn.head_dim] = 0
    with torch.no_grad():
        logits = torch.cat([model(x) for x, _ in data])
    return float(F.cross_entropy(logits, torch.cat([y for _, y in data])))


def test_gradient_free_scores_match_manual_masked_evaluation():
    vit = make_vit("tiny_cls")
    data = labelled_batches(2)
    pruner = GradientFreePruner(members=1, keep_heads=2, diversity="none", metric="nll")
    mask = pruner.prune(family_of(vit), data, data)[0]
    scores = pruner.last_scores[0]
    ref = _manual_nll(vit, {}, data)
    for h in range(4):
        assert scores[0][h].item() == pytest.approx(_manual_nll(vit, {0: [h]}, data) - ref, abs=1e-5)
    # block 1 is scored with block 0 already pruned (greedy, layer by layer)
    dropped0 = [h for h in range(4) if h not in mask.kept_indices(0)]
    ref1 = _manual_nll(vit, {0: dropped0}, data)
    for h in range(4):
        manual = _manual_nll(vit, {0: dropped0, 1: [h]}, data) - ref1
        assert scores[1][h].item() == pytest.approx(manual, abs=1e-5)
    assert mask.kept_indices(0) == sorted(torch.argsort(-scores[0])[:2].tolist())


def test_keep_ratio_that_removes_every_head_is_an_error(vit, batches):
    with pytest.raises(MaskError, match="keeps no head"):
        MagnitudePruner(members=1, keep_ratio=0.05).prune(family_of(vit), batches)


def test_bad_options_are_rejected_up_front():
    with pytest.raises(ValueError, match="keep_ratio"):
        TaylorPruner(keep_ratio=1.5)
    with pytest.raises(ValueError, match="diversity"):
        MagnitudePruner(diversity="bootstrap")
    with pytest.raises(ValueError, match="metric"):
        GradientFreePruner(metric="accuracy")
