"""The training objective of one step: every member's cross-entropy on the batch (its own, so
members stay independent models), with the ensemble levers: logit distillation from a teacher,
per-member bootstrap weights, and a reward for member disagreement on synthetic outliers.

Under torch.distributed the loss is divided by the global batch's real sample count (sampler
padding weighted out), so the averaged gradient is the global batch's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from compressor.core.device import model_device
from compressor.core.distributed import all_reduce_sum
from compressor.data.outliers import OutlierMaker
from compressor.training.config import TrainConfig
from compressor.uq.outputs import logits_reader
from compressor.uq.scores import mutual_information


class MemberObjective:
    """`objective(net, batch, real) -> (loss, [loss sum, real samples] of the global batch)`."""

    def __init__(
        self, model: nn.Module, cfg: TrainConfig, make_outliers: OutlierMaker | None, teacher: nn.Module | None
    ) -> None:
        self.cfg, self.make_outliers = cfg, make_outliers
        self.read = logits_reader(model)
        self.device = model_device(model)
        self.gen = torch.Generator().manual_seed(cfg.seed + 7919)
        self.teacher = teacher if teacher is not None and cfg.distill_alpha > 0 else None
        self.read_teacher = logits_reader(teacher) if self.teacher is not None else None
        if self.teacher is not None:
            self.teacher.eval()

    def _distilled(self, per: torch.Tensor, logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """(1 - alpha) cross-entropy + alpha T^2 KL(teacher || member) at temperature T (Hinton et al. 2015)."""
        t, alpha = self.cfg.distill_temperature, self.cfg.distill_alpha
        with torch.no_grad():
            target = (self.read_teacher(self.teacher(x))[0].float() / t).log_softmax(-1)  # [B, C]
        student = (logits.float() / t).log_softmax(-1)  # [M, B, C]
        kl = (target.exp() * (target - student)).sum(-1) * (t * t)
        return (1 - alpha) * per + alpha * kl.to(per.dtype)

    def __call__(self, net: nn.Module, batch: tuple[torch.Tensor, ...], real: int) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, device = self.cfg, self.device
        x, y = (t.to(device) for t in batch)
        n = len(y)
        inputs = torch.cat([x, self.make_outliers(x, self.gen)]) if cfg.disagreement else x
        logits = self.read(net(inputs))
        m = logits.shape[0]
        per = F.cross_entropy(
            logits[:, :n].reshape(m * n, -1), y.repeat(m), label_smoothing=cfg.label_smoothing, reduction="none"
        ).view(m, n)
        if self.teacher is not None:
            per = self._distilled(per, logits[:, :n], x)
        if cfg.bootstrap and (m > 1 or cfg.ensemble_member):
            per = per * torch.poisson(torch.ones(m, n), generator=self.gen).to(per)
        is_real = (torch.arange(n, device=device) < real).to(per.dtype)
        local_sum = (per.mean(0) * is_real).sum()
        # [loss sum, real samples] of the whole global batch, so every rank divides by the same count
        count = torch.tensor(real, dtype=torch.float64, device=device)
        totals = all_reduce_sum(torch.stack([local_sum.detach().double(), count]))
        loss = local_sum / totals[1].to(local_sum.dtype)
        if cfg.disagreement and m > 1:
            probs = logits[:, n:].float().softmax(-1)
            reward = (mutual_information(probs) * is_real).sum() / totals[1].to(local_sum.dtype)
            loss = loss - cfg.disagreement * reward
        return loss, totals
