"""Short supervised training: the base model, member fine-tunes and the calibration fine-tune.

AdamW, linear warm-up then cosine decay over a step budget, optional label smoothing, early
stopping on held-out NLL (the best weights are restored). For a fused ensemble every member's
logits get their own cross-entropy, averaged, so members stay independent models.

Under torch.distributed the model is wrapped in DistributedDataParallel and every rank trains on
its slice of each global batch, with the loss scaled so that the averaged gradient is the global
batch's: N processes take the same steps as one process with the same batch size.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from compressor.data import loader
from compressor.distributed import all_reduce_sum, is_distributed, is_main, shard, world_size
from compressor.predict import member_logits


@dataclass
class TrainConfig:
    steps: int = 200
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_steps: int = 10
    label_smoothing: float = 0.0
    eval_every: int = 25
    patience: int | None = None  # evaluations without improvement before stopping; None: never
    seed: int = 0


def ensemble_loss(output, y: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean over members of each member's cross-entropy."""
    logits = member_logits(output)
    m, b, c = logits.shape
    return F.cross_entropy(logits.reshape(m * b, c), y.repeat(m), label_smoothing=label_smoothing)


@torch.no_grad()
def heldout_nll(model: nn.Module, ds: Dataset, batch_size: int = 256) -> float:
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64)
    for batch in loader(ds, batch_size):
        x, y = shard(tuple(batch))
        probs = member_logits(model(x)).float().softmax(-1).mean(0)
        total[0] += float(-torch.log(probs[torch.arange(len(y)), y].clamp_min(1e-12)).sum())
        total[1] += len(y)
    model.train(was_training)
    total = all_reduce_sum(total)
    return float(total[0] / total[1].clamp_min(1))


def train(model: nn.Module, train_ds: Dataset, val_ds: Dataset | None, cfg: TrainConfig, desc: str = "train") -> dict:
    """Train `model` in place for `cfg.steps` steps; return the history (losses, val NLL, best step)."""
    torch.manual_seed(cfg.seed)
    net = model
    if is_distributed():
        net = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / max(1, cfg.warmup_steps)
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    history: dict = {"loss": [], "val_nll": [], "best_step": 0, "stopped_early": False}
    best_nll, best_state, bad_evals = math.inf, None, 0
    model.train()
    step, epoch = 0, 0
    bar = tqdm(total=cfg.steps, desc=desc, leave=False, dynamic_ncols=True, disable=not is_main() or None)
    while step < cfg.steps:
        for batch in loader(train_ds, cfg.batch_size, shuffle=True, seed=cfg.seed + epoch):
            x, y = shard(tuple(batch))
            loss = ensemble_loss(net(x), y, cfg.label_smoothing)
            # DDP averages gradients over ranks; weight each slice by its share of the global batch
            scaled = loss * (len(y) * world_size() / len(batch[1]))
            opt.zero_grad(set_to_none=True)
            scaled.backward()
            opt.step()
            sched.step()
            step += 1
            history["loss"].append(float(loss.detach()))
            bar.update(1)
            bar.set_postfix(loss=f"{history['loss'][-1]:.3f}")
            if val_ds is not None and (step % cfg.eval_every == 0 or step == cfg.steps):
                v = heldout_nll(model, val_ds)
                history["val_nll"].append((step, v))
                if v < best_nll - 1e-6:
                    best_nll, bad_evals, history["best_step"] = v, 0, step
                    best_state = copy.deepcopy(model.state_dict())
                else:
                    bad_evals += 1
                    if cfg.patience is not None and bad_evals >= cfg.patience:
                        history["stopped_early"] = True
                        step = cfg.steps
            if step >= cfg.steps:
                break
        epoch += 1
    bar.close()
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return history
