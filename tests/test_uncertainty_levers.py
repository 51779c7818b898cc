"""Validation outliers, uncertainty objectives for circuit selection, MLP-unit masks, the fused
fine-tune's diversity levers, safe fine-tuning and FLOPs counting."""

import copy
from pathlib import Path

import pytest
import torch
from sklearn.metrics import roc_auc_score
from torch.utils.data import TensorDataset

from compressor.core.errors import CompressorError, InputError
from compressor.core.masks import HeadMask, load_masks, save_masks
from compressor.core.registry import resolve
from compressor.data import DataBundle, digits_bundle
from compressor.data.outliers import shuffle_patches, shuffle_tokens
from compressor.families import family_of
from compressor.run.context import RunContext
from compressor.run.recipe import validate_recipe
from compressor.surgery.mlp_units import with_top_units
from compressor.training.config import TrainConfig
from compressor.training.loop import heldout_nll, train
from compressor.uq.evaluate import flops_per_sample
from compressor.uq.scores import mutual_information
from mergers.hydra import build_hydra
from mergers.plain import prune_physically
from pruners.gradient_free import CircuitImportance, evaluate_objective

from .conftest import labelled_batches, make_vit


def test_patch_shuffle_permutes_cells_of_each_image():
    x = torch.arange(2 * 16 * 16, dtype=torch.float32).reshape(2, 1, 16, 16)
    out = shuffle_patches(x, torch.Generator().manual_seed(0), grid=4)
    for i in range(2):
        cells = lambda t: sorted(
            tuple(c.flatten().tolist()) for c in t.reshape(4, 4, 4, 4).transpose(1, 2).reshape(16, 16)
        )  # noqa: E731
        assert cells(out[i, 0]) == cells(x[i, 0]), "the same cells"
    assert not torch.equal(out, x), "in another order"


def test_token_shuffle_keeps_first_last_and_padding():
    ids = torch.tensor([[101, 5, 6, 7, 8, 102, 0, 0], [101, 9, 102, 0, 0, 0, 0, 0]])
    out = shuffle_tokens(ids, torch.Generator().manual_seed(3), pad_id=0)
    assert out[0, 0] == 101 and out[0, 5] == 102 and out[0, 6:].tolist() == [0, 0]
    assert sorted(out[0, 1:5].tolist()) == [5, 6, 7, 8] and out[0, 1:5].tolist() != [5, 6, 7, 8]
    assert torch.equal(out[1], ids[1]), "too short to shuffle"


def test_validation_outliers_share_no_sample_with_any_test_ood_set():
    data = digits_bundle()
    val_out = data.ood_val.tensors[0].flatten(1)
    test_sets = [ds.tensors[0].flatten(1) for ds in data.ood.values()] + [data.test.tensors[0].flatten(1)]
    for test in test_sets:
        assert not (torch.cdist(val_out, test) < 1e-6).any(), "a validation outlier is a test sample"
    assert len(val_out) == len(data.val)


def test_ood_objective_matches_a_hand_computed_auroc():
    """The circuit objective 'auroc' is 1 - AUROC(max-softmax), checked against scikit-learn."""
    vit = make_vit("tiny_cls")
    heldout = labelled_batches(2, batch=12, seed=1)
    outliers = [b[0] * 3.0 for b in labelled_batches(2, batch=10, seed=2)]
    family = family_of(vit)
    with torch.no_grad():
        s_in = torch.cat([-vit(x).softmax(-1).amax(-1) for x, _ in heldout])
        s_out = torch.cat([-vit(x).softmax(-1).amax(-1) for x in outliers])
    expected = 1 - roc_auc_score([0] * len(s_in) + [1] * len(s_out), torch.cat([s_in, s_out]).numpy())
    assert evaluate_objective(family, heldout, outliers, "auroc") == pytest.approx(expected, abs=1e-9)
    nll = evaluate_objective(family, heldout, outliers, "nll")
    assert evaluate_objective(family, heldout, outliers, "nll+auroc") == pytest.approx(nll + expected, abs=1e-9)
    # head scores are the objective's rise when each head is masked (first block, nothing pruned yet)
    scores = CircuitImportance("auroc")(family, heldout, heldout, outliers=outliers)
    for h in range(4):
        mask = HeadMask.from_kept([[j for j in range(4) if j != h], [0, 1, 2, 3]], [4, 4])
        with family.masked(mask):
            worse = evaluate_objective(family, heldout, outliers, "auroc")
        assert scores[0][h].item() == pytest.approx(worse - expected, abs=1e-6)


def test_a_two_part_objective_runs_the_heldout_inputs_once():
    """'nll+auroc' costs one pass over the held-out batches and one over the outliers, not two."""
    family = family_of(make_vit("tiny_cls"))
    heldout = labelled_batches(3, batch=8, seed=1)
    outliers = [b[0] for b in labelled_batches(2, batch=8, seed=2)]
    calls = []
    forward = family.logits
    family.logits = lambda x: calls.append(len(x)) or forward(x)
    evaluate_objective(family, heldout, outliers, "nll+auroc")
    assert calls == [8] * 5  # 3 held-out batches, then 2 outlier batches


def test_ood_objective_without_outliers_is_a_clear_error():
    with pytest.raises(InputError, match="needs validation outliers"):
        CircuitImportance("fpr95")(family_of(make_vit()), labelled_batches(1), labelled_batches(1), outliers=None)


def test_mlp_unit_masks_gate_exactly_what_physical_removal_removes():
    vit = make_vit("small_avg")
    family = family_of(vit)
    heads = family.heads_per_block()
    masks = with_top_units(
        family, [HeadMask.from_kept([[0, 3, 5]] * 3, heads)], 0.25, [b[0] for b in labelled_batches()]
    )
    assert [len(masks[0].kept_units(b)) for b in range(3)] == [64, 64, 64]  # a quarter of 256
    member = copy.deepcopy(vit)
    family_of(member).apply_mask(masks[0])
    pruned = prune_physically(vit, masks[0])
    x = torch.randn(4, 1, 16, 16)
    torch.testing.assert_close(pruned(x), member(x), rtol=1e-5, atol=1e-5)
    assert family_of(pruned).mlp_widths() == [64, 64, 64]
    # the fused model uses exactly the units the masks name
    fused = build_hydra(vit, masks * 2, mlp_mode="pruned")
    torch.testing.assert_close(fused(x).member_logits[1], member(x), rtol=1e-5, atol=1e-5)


def test_mlp_units_reselected_from_a_saved_mask_match_the_fresh_choice(tmp_path):
    """A masks.json that already names units, pruned again with mlp_keep_ratio (the `file` pruner
    in a recipe), keeps the units a fresh selection keeps; a different ratio still re-selects."""
    vit = make_vit("small_avg")
    family = family_of(vit)
    calib = [b[0] for b in labelled_batches()]
    heads_only = [HeadMask.from_kept([[0, 3, 5]] * 3, family.heads_per_block())]
    fresh = with_top_units(family, heads_only, 0.25, calib)
    save_masks(tmp_path / "masks.json", fresh)
    reread = load_masks(tmp_path / "masks.json")
    assert with_top_units(family, reread, 0.25, calib) == fresh
    assert with_top_units(family, reread, 0.5, calib) == with_top_units(family, heads_only, 0.5, calib)


@pytest.fixture(scope="module")
def digits_small():
    data = digits_bundle()
    return (
        data,
        TensorDataset(*(t[:256] for t in data.train.tensors)),
        TensorDataset(*(t[:64] for t in data.val.tensors)),
    )


@pytest.fixture(scope="module")
def trained_vit(digits_small):
    """A tiny ViT trained briefly on digits: confident enough for the levers to show."""
    _, train_set, _ = digits_small
    vit = make_vit("tiny_cls")
    train(vit, train_set, None, TrainConfig(steps=60, batch_size=64, lr=3e-3, warmup_steps=5))
    return vit


def _fused_pair(vit):
    masks = [HeadMask.from_kept([[0, 1], [2, 3]], [4, 4]), HeadMask.from_kept([[2, 3], [0, 1]], [4, 4])]
    return build_hydra(vit, masks, mlp_mode="grouped")


def test_disagreement_reward_raises_member_disagreement_on_outliers(digits_small, trained_vit):
    data, train_set, _ = digits_small
    outliers = shuffle_patches(data.val.tensors[0][:64], torch.Generator().manual_seed(1))
    mi = {}
    for reward in (0.0, 3.0):
        fused = _fused_pair(trained_vit)
        cfg = TrainConfig(steps=20, batch_size=64, lr=3e-3, warmup_steps=1, disagreement=reward)
        train(fused, train_set, None, cfg, make_outliers=shuffle_patches)
        with torch.no_grad():
            mi[reward] = float(mutual_information(fused(outliers).member_logits.softmax(-1)).mean())
    assert mi[3.0] > 3 * mi[0.0], mi


def test_bootstrap_weights_make_identical_members_diverge(digits_small, trained_vit):
    """Two members with the same heads: without bootstrap weights they stay identical under
    training; with per-member bootstrap weights they diverge."""
    _, train_set, _ = digits_small
    same = HeadMask.from_kept([[0, 1], [2, 3]], [4, 4])
    gap = {}
    for boot in (False, True):
        fused = build_hydra(trained_vit, [same, same], mlp_mode="grouped")
        train(fused, train_set, None, TrainConfig(steps=5, batch_size=64, lr=3e-3, warmup_steps=1, bootstrap=boot))
        w = fused.blocks[1].mlp.fc1.weight
        gap[boot] = float((w[0] - w[1]).abs().max())
    assert gap[False] == 0.0 and gap[True] > 1e-4, gap


def test_bootstrap_reweights_a_member_trained_alone_but_not_a_plain_model(digits_small, trained_vit):
    """`finetune: {target: members, bootstrap: true}`: each member trained alone sees its own
    Poisson(1) weights (bagging); a plain single model's fine-tune ignores the flag."""
    _, train_set, _ = digits_small
    weights = {}
    for name, extra in {
        "plain": {},
        "plain+bootstrap": {"bootstrap": True},
        "member+bootstrap": {"bootstrap": True, "ensemble_member": True},
    }.items():
        vit = copy.deepcopy(trained_vit)
        train(vit, train_set, None, TrainConfig(steps=3, batch_size=64, lr=3e-3, warmup_steps=1, **extra))
        weights[name] = vit.blocks[1].mlp.fc1.weight.detach()
    assert torch.equal(weights["plain"], weights["plain+bootstrap"])
    assert float((weights["plain"] - weights["member+bootstrap"]).abs().max()) > 1e-5


def test_a_fine_tune_that_makes_the_model_worse_leaves_it_as_it_was(digits_small, trained_vit):
    _, train_set, val = digits_small
    vit = copy.deepcopy(trained_vit)
    before = copy.deepcopy(vit.state_dict())
    nll0 = heldout_nll(vit, val)
    history = train(vit, train_set, val, TrainConfig(steps=4, batch_size=32, lr=5.0, warmup_steps=1, eval_every=2))
    assert history["best_step"] == 0 and history["val_nll"][0] == (0, pytest.approx(nll0))
    assert all(torch.equal(v, before[k]) for k, v in vit.state_dict().items()), "step-0 weights kept"


def test_keep_last_keeps_the_weights_as_trained_even_when_no_step_beat_step_0(digits_small, trained_vit):
    """`keep: last` (members that would stay near-copies of the base): the same weights as training
    without a held-out split, where `keep: best` falls back to step 0."""
    _, train_set, val = digits_small
    cfg = dict(steps=4, batch_size=32, lr=5.0, warmup_steps=1, eval_every=2)
    weights = {}
    for keep, held in (("last", val), ("best", val), ("none", None)):
        vit = copy.deepcopy(trained_vit)
        history = train(vit, train_set, held, TrainConfig(**cfg, keep="best" if keep == "none" else keep))
        weights[keep] = vit.state_dict()
        assert history["kept"] == ("last" if keep != "best" else "best")
    assert all(torch.equal(v, weights["none"][k]) for k, v in weights["last"].items())
    assert not all(torch.equal(v, weights["best"][k]) for k, v in weights["last"].items())


def test_flops_are_counted_and_hydra_pruned_costs_about_one_model():
    assert flops_per_sample(torch.nn.Linear(10, 20), torch.randn(3, 10)) == 2 * 10 * 20
    vit = make_vit("small_avg")  # 8 heads, 3 members of 8/3 heads and 1/3 of the MLP
    heads = family_of(vit).heads_per_block()
    masks = [HeadMask.from_kept([list(range(m, 8, 3))] * 3, heads) for m in range(3)]
    fused = build_hydra(vit, masks, mlp_mode="pruned", mlp_keep_ratio=1 / 3)
    x = torch.randn(4, 1, 16, 16)
    ratio = flops_per_sample(fused, x) / flops_per_sample(vit, x)
    assert 0.95 < ratio < 1.05, ratio
    grouped = build_hydra(vit, masks, mlp_mode="grouped")
    assert 2.0 < flops_per_sample(grouped, x) / flops_per_sample(vit, x) < 2.6


def _members_after_reinit(digits_small, base, **finetune) -> list[torch.nn.Module]:
    """Two head-masked members of `base` after a members fine-tune of one negligible step."""
    _, train_set, val = digits_small
    raw = {
        "name": "reinit",
        "model": {"name": "vit_tiny_patch16_224"},
        "steps": [
            {"prune": {"pruner": "random", "members": 2}},
            {"finetune": {"target": "members", "steps": 1, "lr": 1e-9, **finetune}},
        ],
    }
    recipe = validate_recipe(raw)
    masks = [HeadMask.from_kept([[0, 1], [2, 3]], [4, 4]), HeadMask.from_kept([[2, 3], [0, 1]], [4, 4])]
    bundle = DataBundle(train=train_set, val=val, test=val)
    ctx = RunContext(recipe=recipe, out=Path("."), data=bundle, base=base, masks=masks)
    resolve("step", "finetune").run(ctx, recipe.steps[1][1])
    return ctx.members


def test_reinit_blocks_gives_each_member_fresh_last_blocks_and_keeps_the_rest(digits_small, trained_vit):
    """`finetune: {target: members, reinit_blocks: 1, reinit_head: true}`: each member's last block
    and classifier are redrawn from its own seed (different from the base and from each other);
    earlier blocks start from the base's weights."""
    a, b = _members_after_reinit(digits_small, trained_vit, reinit_blocks=1, reinit_head=True)
    first, last = (trained_vit.blocks[i].mlp.fc1.weight for i in (0, 1))
    for member in (a, b):
        assert torch.allclose(member.blocks[0].mlp.fc1.weight, first, atol=1e-6)
        assert not torch.allclose(member.blocks[1].mlp.fc1.weight, last, atol=1e-3)
        assert not torch.allclose(member.head.weight, trained_vit.head.weight, atol=1e-3)
    assert not torch.allclose(a.blocks[1].attn.qkv.weight, b.blocks[1].attn.qkv.weight, atol=1e-3)
    assert not torch.allclose(a.head.weight, b.head.weight, atol=1e-3)


def test_reinit_blocks_all_redraws_every_block_and_keeps_the_embeddings(digits_small, trained_vit):
    """`reinit_blocks: all` redraws every transformer block of each member, whatever the depth (the
    default recipe's setting); the base's patch and position embeddings stay."""
    a, b = _members_after_reinit(digits_small, trained_vit, reinit_blocks="all")
    for member in (a, b):
        for i, block in enumerate(trained_vit.blocks):
            assert not torch.allclose(member.blocks[i].mlp.fc1.weight, block.mlp.fc1.weight, atol=1e-3)
        assert torch.allclose(member.patch_embed.proj.weight, trained_vit.patch_embed.proj.weight, atol=1e-6)
        assert torch.allclose(member.pos_embed, trained_vit.pos_embed, atol=1e-6)
    assert not torch.allclose(a.blocks[0].attn.qkv.weight, b.blocks[0].attn.qkv.weight, atol=1e-3)


def test_reinit_blocks_takes_a_count_or_all_and_nothing_else():
    def recipe(value):
        return {
            "name": "r",
            "model": {"name": "vit_tiny_patch16_224"},
            "steps": [
                {"prune": {"pruner": "random", "members": 2}},
                {"finetune": {"target": "members", "reinit_blocks": value}},
            ],
        }

    assert validate_recipe(recipe("all")).steps[1][1]["reinit_blocks"] == "all"
    for bad in ("every", -1):
        with pytest.raises(CompressorError, match="an integer >= 0 or 'all'"):
            validate_recipe(recipe(bad))
