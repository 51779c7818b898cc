"""Physical removal through torch-pruning's DependencyGraph: for every family, the pruned model
(heads and MLP units cut) equals the head- and unit-masked model, and the cuts were made by
torch-pruning where its graph expresses them."""

import copy

import pytest
import torch

from compressor.core.masks import HeadMask
from compressor.families import family_of
from compressor.surgery.mlp_units import with_top_units
from compressor.surgery.physical import prune_physically

from .conftest import make_vit
from .test_hf import _hf_classifier, _hf_inputs


def _mask(model, x):
    family = family_of(model)
    heads = family.heads_per_block()
    g = torch.Generator().manual_seed(5)
    kept = [sorted(torch.randperm(h, generator=g)[: max(1, h // 2 - b % 2)].tolist()) for b, h in enumerate(heads)]
    return with_top_units(family, [HeadMask.from_kept(kept, heads)], 0.4, [x])[0]


def _logits(model, x):
    return family_of(model).logits(x)


@pytest.mark.parametrize("kind", ["tiny_cls", "small_avg", "qk_norm", "registers", "vit", "clip_vision", "clip_text"])
def test_removal_equals_masking_and_uses_torch_pruning(kind):
    if kind in ("vit", "clip_vision", "clip_text"):
        model, x = _hf_classifier(kind), _hf_inputs(kind)
    else:
        model, x = make_vit(kind), torch.randn(3, 1, 16, 16)
    mask = _mask(model, x)
    masked = copy.deepcopy(model)
    family_of(masked).apply_mask(mask)
    cuts: dict = {}
    pruned = prune_physically(model, mask, cuts)
    with torch.no_grad():
        torch.testing.assert_close(_logits(pruned, x), _logits(masked, x), rtol=1e-5, atol=1e-5)
    family = family_of(pruned)
    assert family.heads_per_block() == mask.num_kept()
    assert family.mlp_widths() == [len(mask.kept_units(b)) for b in range(mask.num_blocks)]
    assert cuts and set(cuts.values()) == {"torch-pruning"}, cuts
    assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in model.parameters())


def test_torch_pruning_magnitude_importance_by_name():
    """'magnitude' is torch-pruning's GroupMagnitudeImportance on the fc1->fc2 group: the mean of
    the unit's squared fc1-row and fc2-column norms, divided by its mean over the block."""
    from compressor.surgery.mlp_units import unit_scores

    vit = make_vit("tiny_cls")
    family = family_of(vit)
    scores = unit_scores(family, HeadMask.full([4, 4]), [], "magnitude")
    for b, s in enumerate(scores):
        mlp = family.mlp(b)
        raw = ((mlp.fc1.get().weight ** 2).sum(1) + (mlp.fc2.get().weight ** 2).sum(0)) / 2
        torch.testing.assert_close(s, (raw / raw.mean()).detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("allocation", ["uniform", "global"])
@pytest.mark.parametrize("kind, ratio", [("flops", 0.5), ("params", 0.5), ("flops", 0.7)])
def test_budget_is_met_within_two_percent(kind, ratio, allocation):
    from compressor.surgery.budget import budget_mask, measure
    from compressor.surgery.mlp_units import unit_scores
    from pruners.taylor import taylor_scores

    from .conftest import labelled_batches

    vit = make_vit("small_avg")
    family = family_of(vit)
    data = labelled_batches(2, classes=5)  # small_avg has 5 classes
    heads = taylor_scores(family, data)
    units = unit_scores(family, HeadMask.full(family.heads_per_block()), data, "taylor")
    mask = budget_mask(family, heads, units, {kind: ratio}, tokens=4, allocation=allocation)
    pruned = prune_physically(vit, mask)
    kept = measure(pruned, family_of(pruned), kind) / measure(vit, family, kind)
    assert ratio - 0.02 <= kept <= ratio, kept
    assert all(n >= 1 for n in mask.num_kept()), "a floor of one head per block"
    assert all(len(mask.kept_units(b)) >= 25 for b in range(3)), "a floor of 10% of the units"
    if allocation == "uniform":  # the same share of heads in every block, each block's best heads
        assert len(set(mask.num_kept())) == 1
        for b, s in enumerate(heads):
            kept = mask.kept_indices(b)
            assert kept == sorted(torch.topk(s, len(kept)).indices.tolist())


def test_distillation_pulls_the_student_to_the_teacher():
    import torch.nn.functional as F
    from torch.utils.data import TensorDataset

    from compressor.data import digits_bundle
    from compressor.training.config import TrainConfig
    from compressor.training.loop import train

    data = digits_bundle()
    teacher = make_vit("tiny_cls", seed=1)
    train_set = TensorDataset(*(t[:128] for t in data.train.tensors))
    x = data.val.tensors[0][:64]

    def kl(student):
        with torch.no_grad():
            return float(
                F.kl_div(student(x).log_softmax(-1), teacher(x).log_softmax(-1), log_target=True, reduction="batchmean")
            )

    results = {}
    for alpha in (0.0, 1.0):
        student = make_vit("tiny_cls", seed=2)
        cfg = TrainConfig(
            steps=30, batch_size=64, lr=3e-3, warmup_steps=1, distill_alpha=alpha, distill_temperature=1.0
        )
        train(student, train_set, None, cfg, teacher=teacher)
        results[alpha] = kl(student)
    assert results[1.0] < 0.5 * results[0.0], results


@pytest.mark.parametrize("allocation", ["uniform", "global"])
def test_iterative_budget_rescores_what_is_left_and_meets_the_target(allocation):
    """Three steps to 0.5x FLOPs: each step is scored on the model pruned so far (the scorer sees
    the previous step's mask), removals stay removed, the final mask meets the target, and the
    scores given at the last step decide which survivors stay."""
    from compressor.surgery.budget import budget_mask, iterative_budget_mask, measure
    from compressor.surgery.mlp_units import unit_scores
    from pruners.taylor import taylor_scores

    from .conftest import labelled_batches

    vit = make_vit("small_avg")
    family = family_of(vit)
    data = labelled_batches(2, classes=5)

    def taylor(mask):
        with family.masked(mask):
            heads = taylor_scores(family, data)
        return heads, unit_scores(family, mask or HeadMask.full(family.heads_per_block()), data, "taylor")

    seen, given = [], []

    def scores_of(mask):
        heads, units = taylor(mask)
        if len(seen) == 2:  # the last step: reversed head scores, so the survivors' order flips
            heads = [-h for h in heads]
        seen.append(mask)
        given.append(heads)
        return heads, units

    mask = iterative_budget_mask(family, scores_of, {"flops": 0.5}, tokens=4, allocation=allocation, steps=3)
    assert len(seen) == 3 and seen[0] is None and seen[1] is not None and seen[2] is not None
    for earlier, later in [(seen[1], seen[2]), (seen[2], mask)]:  # nested: nothing removed comes back
        assert not any(bool((b & ~a).any()) for a, b in zip(earlier.blocks, later.blocks))
        assert not any(bool((u & ~v).any()) for v, u in zip(earlier.units, later.units))
    assert seen[1] != seen[2] != mask, "every step removed something"
    pruned = prune_physically(vit, mask)
    kept = measure(pruned, family_of(pruned), "flops") / measure(vit, family, "flops")
    assert 0.48 <= kept <= 0.5, kept
    if allocation == "uniform":  # among step 2's survivors, the best by the last (reversed) scores
        for b in range(mask.num_blocks):
            alive = seen[2].kept_indices(b)
            order = sorted(alive, key=lambda h: -float(given[2][b][h]))
            assert mask.kept_indices(b) == sorted(order[: len(mask.kept_indices(b))])
    heads, units = taylor(None)
    one = iterative_budget_mask(family, lambda m: (heads, units), {"flops": 0.5}, 4, allocation, steps=1)
    assert one == budget_mask(family, heads, units, {"flops": 0.5}, 4, allocation)


def test_prune_step_reaches_a_flops_target_in_steps(tmp_path):
    """The recipe path: `target` + `iterative_steps: 2` re-scores heads (the pruner) and units on
    the half-pruned model, and the plain model it yields has the FLOPs the target asks for; a
    pruner that cannot re-score heads is refused by preflight, in one line."""
    from compressor.core.errors import InputError
    from compressor.run.recipe import validate_recipe
    from compressor.run.runner import Runner
    from compressor.surgery.budget import measure

    kwargs = {"img_size": 16, "patch_size": 4, "embed_dim": 48, "depth": 2, "num_heads": 4}
    model = {"name": "vit_tiny_patch16_224", "kwargs": kwargs, "train_base": {"steps": 4, "eval_every": 2}}
    prune = {"pruner": "taylor", "members": 1, "target": {"flops": 0.6}, "iterative_steps": 2}
    raw = {
        "name": "it", "model": model, "data": {"source": "digits", "calibration_samples": 64},
        "steps": [{"prune": {**prune, "mlp_importance": "taylor"}}, {"merge": {"merger": "plain"}}],
    }  # fmt: skip
    ctx = Runner(validate_recipe(raw, "it.yaml"), tmp_path / "run", quiet=True).run()
    kept = measure(ctx.merged, family_of(ctx.merged), "flops") / measure(ctx.base, family_of(ctx.base), "flops")
    assert 0.58 <= kept <= 0.6, kept
    raw["steps"][0]["prune"] = {**prune, "pruner": "random"}
    with pytest.raises(InputError, match="prune.iterative_steps: pruner 'random' cannot re-score heads"):
        Runner(validate_recipe(raw, "it.yaml"), tmp_path / "run2", quiet=True).run()
    raw["steps"][0]["prune"] = {**prune, "iterative_steps": 0}
    with pytest.raises(Exception, match="iterative_steps"):
        validate_recipe(raw, "it.yaml")
