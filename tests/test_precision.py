"""Training under `precision: bf16` (autocast around a whole step): every forward reads the weights
as they are now, so a bf16 run trains like an fp32 one and the held-out metrics measured during
training are those of the weights it ends with. Runs on the CPU (autocast bf16), kept tiny."""

import pytest
import timm
import torch

from compressor.core.device import precision_context
from compressor.data import digits_bundle
from compressor.training.config import TrainConfig
from compressor.training.loop import heldout_metrics, train

CPU = torch.device("cpu")


def test_a_forward_under_bf16_reads_the_weights_written_since_the_last_one():
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    with precision_context(CPU, "bf16"):
        before = lin(x).float()
        with torch.no_grad():
            lin.weight.mul_(3.0)  # what an optimiser step or load_state_dict does: in place
        after = lin(x).float()
        with torch.no_grad():
            evaluated = lin(x).float()
    expected = torch.nn.functional.linear(x, lin.weight, lin.bias)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, expected, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(evaluated, after)


def _train(precision: str, steps: int = 60) -> tuple[torch.nn.Module, dict, object]:
    data = digits_bundle()
    torch.manual_seed(0)
    kwargs = {"img_size": 16, "patch_size": 4, "embed_dim": 48, "depth": 2, "num_heads": 4}
    model = timm.create_model("vit_tiny_patch16_224", in_chans=1, num_classes=8, **kwargs)
    cfg = TrainConfig(steps=steps, batch_size=64, lr=2e-3, eval_every=10)
    with precision_context(CPU, precision):  # as the runner wraps a whole step
        history = train(model, data.train, data.val, cfg)
    return model, history, data


@pytest.fixture(scope="module")
def trained() -> dict:
    return {p: _train(p) for p in ("fp32", "bf16")}


def test_bf16_training_reaches_the_accuracy_of_fp32_training(trained):
    accuracy = {}
    for precision, (model, _, data) in trained.items():
        with precision_context(CPU, precision):
            accuracy[precision] = heldout_metrics(model, data.test)["accuracy"]
    assert accuracy["fp32"] > 0.35, accuracy  # it learned: chance is 0.125
    assert accuracy["bf16"] == pytest.approx(accuracy["fp32"], abs=0.05), accuracy


def test_heldout_metrics_during_bf16_training_are_those_of_the_final_weights(trained):
    model, history, data = trained["bf16"]
    with precision_context(CPU, "bf16"):  # a later step: the evaluate step's own context
        fresh = heldout_metrics(model, data.val)
    assert history["after"]["accuracy"] == pytest.approx(fresh["accuracy"], abs=1e-9)
    assert history["after"]["nll"] == pytest.approx(fresh["nll"], rel=1e-3)
    assert history["after"]["accuracy"] != pytest.approx(history["before"]["accuracy"], abs=1e-3), "it trained"


def test_a_fused_models_probabilities_sum_to_one_under_bf16():
    """The fused model's averaged softmax is taken in float32 even when autocast makes its logits
    bf16 (rows summed to 0.998 and the held-out metrics of a merged bf16 fine-tune refused them)."""
    from compressor.core.masks import HeadMask
    from mergers.hydra import build_hydra

    torch.manual_seed(0)
    kwargs = {"img_size": 16, "patch_size": 4, "embed_dim": 48, "depth": 2, "num_heads": 4}
    base = timm.create_model("vit_tiny_patch16_224", in_chans=1, num_classes=8, **kwargs).eval()
    masks = [HeadMask.from_kept([[m, m + 2], [m, m + 2]], [4, 4]) for m in range(2)]
    fused = build_hydra(base, masks, mlp_mode="average").eval()
    x = digits_bundle().test.tensors[0][:64]
    with precision_context(CPU, "bf16"), torch.no_grad():
        out = fused(x)
    assert out.member_logits.dtype == torch.bfloat16 and out.probs.dtype == torch.float32
    torch.testing.assert_close(out.probs.sum(-1), torch.ones(64), rtol=0, atol=1e-5)
    torch.testing.assert_close(out.probs, out.member_logits.float().softmax(-1).mean(0))
