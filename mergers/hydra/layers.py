"""Building blocks of the fused ensemble: every layer maps M member streams side by side.

Streams have shape [M, B, T, D]; member m's stream is x[m]. Member streams never mix: every
layer here is block-diagonal over members, so the fused model is M independent models computed
together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from compressor.core.errors import OptionError


class GroupedLinear(nn.Module):
    """M independent Linear maps whose group widths may differ, computed as one batched matmul.

    Weights are stored padded, weight [M, max_in, max_out] (transposed for `baddbmm`). Member m
    reads the input features where `in_mask[m]` is True and writes the outputs where `out_mask[m]`
    is True (by default the first in_features[m] / out_features[m]). Every other entry is zero and
    stays zero (a fixed mask multiplies the weight when there is any padding), so padded outputs
    are exactly 0 and padded inputs are ignored.
    """

    def __init__(
        self,
        in_features: Sequence[int],
        out_features: Sequence[int],
        bias: bool = True,
        out_mask: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if len(in_features) != len(out_features):
            raise OptionError("in_features and out_features must list one width per member")
        m = len(in_features)
        i_max = max(in_features)
        in_mask = torch.arange(i_max)[None, :] < torch.as_tensor(list(in_features))[:, None]
        if out_mask is None:
            o_max = max(out_features)
            out_mask = torch.arange(o_max)[None, :] < torch.as_tensor(list(out_features))[:, None]
        self.register_buffer("in_mask", in_mask, persistent=False)
        self.register_buffer("out_mask", out_mask.bool(), persistent=False)
        self.weight = nn.Parameter(torch.zeros(m, i_max, out_mask.shape[1]))
        self.bias = nn.Parameter(torch.zeros(m, 1, out_mask.shape[1])) if bias else None
        self.padded = not bool(in_mask.all() and out_mask.all())
        if self.padded:
            self.register_buffer("weight_mask", (in_mask[:, :, None] & out_mask[:, None, :]).float(), persistent=False)

    @property
    def members(self) -> int:
        return self.weight.shape[0]

    def set_member(self, m: int, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Load member m from a Linear-style weight [out, in] (and bias [out])."""
        ins, outs = torch.nonzero(self.in_mask[m]).flatten(), torch.nonzero(self.out_mask[m]).flatten()
        if tuple(weight.shape) != (outs.numel(), ins.numel()):
            raise OptionError(f"member {m}: expected weight [{outs.numel()}, {ins.numel()}], got {list(weight.shape)}")
        with torch.no_grad():
            self.weight[m].zero_()
            self.weight[m][ins[:, None], outs[None, :]] = weight.t().to(self.weight.dtype)
            if self.bias is not None:
                self.bias[m].zero_()
                if bias is not None:
                    self.bias[m, 0, outs] = bias.to(self.bias.dtype)

    def forward(self, x: torch.Tensor, in_affine: MemberAffine | None = None) -> torch.Tensor:
        """x: [M, N, max_in] -> [M, N, max_out].

        `in_affine`, a per-member scale g and shift s of x (a norm's affine), is folded into the
        weights, (x g + s) W + b = x (g W) + (s W + b): the M-times-wider stream is then read once
        less, for the cost of rescaling the weights once per call.
        """
        w = self.weight * self.weight_mask if self.padded else self.weight
        b = None
        if self.bias is not None:
            b = self.bias * self.out_mask[:, None, :].to(self.bias.dtype) if self.padded else self.bias
        if in_affine is not None:
            if in_affine.bias is not None:
                shift = torch.bmm(in_affine.bias[:, None, :].to(w.dtype), w)  # [M, 1, max_out]
                b = shift if b is None else b + shift
            w = w * in_affine.weight[:, :, None].to(w.dtype)
        if _use_member_gemms(x, w):
            return _member_gemms(x, w, b)
        return torch.bmm(x, w) if b is None else torch.baddbmm(b, x, w)

    def extra_repr(self) -> str:
        return f"members={self.members}, in={self.weight.shape[1]}, out={self.weight.shape[2]}, padded={self.padded}"


def _use_member_gemms(x: torch.Tensor, w: torch.Tensor) -> bool:
    """On the CPU, for inference, one GEMM per member beats `bmm` (measured: benchmarks/grouped_linear.py).

    CPU `bmm` parallelises over the member dimension, so M = 3 members on 2 threads leave a thread
    idle half the time, while each full GEMM uses every thread. Autograd, `torch.compile` and
    `torch.export` keep the single batched call.
    """
    return (
        x.device.type == "cpu"
        and not torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and x.shape[1] * w.shape[1] * w.shape[2] >= 1 << 22
    )


def _member_gemms(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    kind = x.device.type
    if torch.is_autocast_enabled(kind):  # `out=` calls are not autocast: cast as autocast would
        dtype = torch.get_autocast_dtype(kind)
        x, w, b = x.to(dtype), w.to(dtype), None if b is None else b.to(dtype)
    out = torch.empty(x.shape[0], x.shape[1], w.shape[2], dtype=x.dtype, device=x.device)
    for m in range(x.shape[0]):
        if b is None:
            torch.mm(x[m], w[m], out=out[m])
        else:
            torch.addmm(b[m], x[m], w[m], out=out[m])
    return out


def run_in_chunks(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    bytes_per_sample: int,
    budget_bytes: int | None,
    out_batch_dim: int = 1,
) -> torch.Tensor:
    """fn(x), computed over batch chunks of x when `inference_chunk` says so; the outputs are joined
    along `out_batch_dim` (1 for member logits [M, B, C])."""
    chunk = inference_chunk(x, bytes_per_sample, budget_bytes)
    if chunk is None:
        return fn(x)
    return torch.cat([fn(c) for c in x.split(chunk)], dim=out_batch_dim)


def inference_chunk(x: torch.Tensor, activation_bytes_per_sample: int, budget_bytes: int | None) -> int | None:
    """How many samples to run at once for CPU inference so that the widest activation of all
    member streams together stays within `budget_bytes`; None to run the whole batch.

    The fused model keeps M streams alive at once, so at a large batch its MLP activations are M
    times a single model's and fall out of the CPU caches (measured: benchmarks/hydra_speed.py).
    Samples are independent, so running chunks is exact. Autograd, torch.compile, torch.export,
    tracing and accelerators keep the whole batch.
    """
    if (
        not budget_bytes
        or x.device.type != "cpu"
        or torch.is_grad_enabled()
        or torch.compiler.is_compiling()
        or torch.compiler.is_exporting()
        or torch.jit.is_tracing()
    ):
        return None
    chunk = max(1, budget_bytes // max(activation_bytes_per_sample, 1))
    return chunk if chunk < x.shape[0] else None


def widest_member_activation(blocks: Sequence[nn.Module]) -> int:
    """Features per token of the widest layer output over all members (grouped QKV or MLP hidden)."""
    widest = 0
    for blk in blocks:
        widest = max(widest, blk.attn.qkv.members * blk.attn.qkv.weight.shape[2])
        mlp = blk.mlp
        if isinstance(mlp, HydraMLP):
            widest = max(widest, mlp.fc1.members * mlp.fc1.weight.shape[2])
        else:  # SharedMLP on every stream
            widest = max(widest, blk.attn.qkv.members * mlp.fc1.out_features)
    return widest


class MemberAffine(nn.Module):
    """Per-member elementwise scale and shift over the last dim: weight, bias [M, D]."""

    def __init__(self, members: int, dim: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(members, dim))
        self.bias = nn.Parameter(torch.zeros(members, dim)) if bias else None

    def _view(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape[0], *([1] * (x.dim() - 2)), t.shape[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return x * self._view(self.weight, x)
        # one pass over the M-times-wider stream instead of two (a multiply, then an add)
        return torch.addcmul(self._view(self.bias, x), x, self._view(self.weight, x))


class MemberLayerNorm(nn.Module):
    """LayerNorm over the last dim with a different affine per member (x: [M, ...])."""

    def __init__(self, members: int, dim: int, eps: float = 1e-6, bias: bool = True) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.affine = MemberAffine(members, dim, bias)
        # an identity affine, passed explicitly: CPU `layer_norm` without weight and bias takes a
        # path about 3x slower than with them (measured: torch 2.14, [3, 13, 197, 192] fp32)
        self.register_buffer("unit_weight", torch.ones(dim), persistent=False)
        self.register_buffer("unit_bias", torch.zeros(dim), persistent=False)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """The norm without its per-member affine (for a following layer that folds it in)."""
        w, b = self.unit_weight.to(x.dtype), self.unit_bias.to(x.dtype)
        return F.layer_norm(x, (self.dim,), w, b, self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.affine(self.normalize(x))


class HydraAttention(nn.Module):
    """Fused multi-member attention: grouped QKV, ONE scaled_dot_product_attention, grouped proj.

    heads[m] is the number of heads member m keeps (may differ). Heads are laid out per member,
    padded to max(heads); padded heads have all-zero Q/K/V weights (their output is exactly 0,
    since V is 0) and zero output-projection rows, so they change nothing. `q_norm`/`k_norm`
    (timm's qk_norm: a LayerNorm over each head's dim) are shared or per member.
    """

    def __init__(
        self,
        dim: int,
        heads: Sequence[int],
        head_dim: int,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.heads = [int(h) for h in heads]
        self.head_dim = head_dim
        self.max_heads = max(self.heads)
        m = len(self.heads)
        # member m's q/k/v outputs live at [s, j, :] for s in q,k,v and its heads j < heads[m]
        head_ok = torch.arange(self.max_heads)[None, :] < torch.as_tensor(self.heads)[:, None]  # [M, h]
        out_mask = head_ok[:, None, :, None].expand(m, 3, self.max_heads, head_dim).reshape(m, -1)
        self.qkv = GroupedLinear([dim] * m, [3 * self.max_heads * head_dim] * m, bias=qkv_bias, out_mask=out_mask)
        self.q_norm = q_norm if q_norm is not None else nn.Identity()
        self.k_norm = k_norm if k_norm is not None else nn.Identity()
        self.proj = GroupedLinear([h * head_dim for h in self.heads], [dim] * m, bias=proj_bias)
        self.attn_drop = attn_drop
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, in_affine: MemberAffine | None = None
    ) -> torch.Tensor:
        """x: [M, B, T, D]; attn_mask: optional bool [B or 1, 1, T or 1, T], True where a query may
        attend to a key (the same for every member and head); in_affine: applied to x first,
        folded into the QKV weights."""
        m, b, t, d = x.shape
        h, hd = self.max_heads, self.head_dim
        qkv = self.qkv(x.reshape(m, b * t, d), in_affine)  # [M, B*T, 3*h*hd]; per member: [3, heads, hd] padded
        qkv = qkv.view(m, b, t, 3, h, hd).permute(3, 0, 1, 4, 2, 5)  # [3, M, B, h, T, hd]
        q, k, v = (s.reshape(m * b, h, t, hd) for s in (self.q_norm(qkv[0]), self.k_norm(qkv[1]), qkv[2]))
        mask = None
        if attn_mask is not None:  # batch index of q/k/v is member * B + sample
            mask = attn_mask.expand(b, *attn_mask.shape[1:]).repeat(m, 1, 1, 1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.attn_drop if self.training else 0.0)
        o = o.transpose(1, 2).reshape(m, b * t, h * hd)
        return self.proj_drop(self.proj(o).view(m, b, t, d))


class HydraMLP(nn.Module):
    """Per-member MLPs of possibly different widths as two GroupedLinear layers."""

    def __init__(
        self,
        dim: int,
        hidden: Sequence[int],
        act: nn.Module,
        bias: bool = True,
        act_drop: float = 0.0,
        drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.hidden = [int(h) for h in hidden]
        m = len(self.hidden)
        self.fc1 = GroupedLinear([dim] * m, self.hidden, bias=bias)
        self.act = act
        self.drop1 = nn.Dropout(act_drop)
        self.fc2 = GroupedLinear(self.hidden, [dim] * m, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, in_affine: MemberAffine | None = None) -> torch.Tensor:
        """x: [M, B, T, D]; in_affine: applied to x first, folded into fc1's weights."""
        m, b, t, d = x.shape
        y = self.drop1(self.act(self.fc1(x.reshape(m, b * t, d), in_affine)))
        return self.drop2(self.fc2(y)).view(m, b, t, d)


class SharedMLP(nn.Module):
    """One MLP applied to every member stream (the paper's averaged-MLP mode)."""

    def __init__(
        self, dim: int, hidden: int, act: nn.Module, bias: bool = True, act_drop: float = 0.0, drop: float = 0.0
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.act = act
        self.drop1 = nn.Dropout(act_drop)
        self.fc2 = nn.Linear(hidden, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))
