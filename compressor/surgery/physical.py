"""Physical removal of attention heads and MLP units through torch-pruning's DependencyGraph.

- Heads: the group rooted at a block's output projection, on the input channels of the removed
  heads; torch-pruning carries the cut to the q/k/v rows (through timm's fused qkv reshape and
  unbind, or to transformers' three projections).
- MLP units: the group rooted at fc1's output channels (torch-pruning carries it to fc2's inputs).

Where torch-pruning's graph cannot express a cut, the cut is made directly by the family layer
(`Family.prune_heads_` / `prune_mlp_units_`), and the reason is stated here:
- timm's qk-norm LayerNorms act on each head's dimension and are shared by all heads; the graph
  would cut them as if they spanned all heads, so they are ignored layers in the graph;
- a group that does not reach every q/k/v projection of the block, or a model torch-pruning
  cannot trace, falls back to the direct cut.
After each cut the family sets every attribute the forward reads (num_heads, head_dim/attn_dim,
num_attention_heads, all_head_size). Tests check every removal against the head-masked model.
"""

from __future__ import annotations

import copy
import warnings

import torch
import torch_pruning as tp
from torch import nn

from compressor.core.masks import HeadMask
from compressor.families import Family, family_of
from compressor.families.parts import head_columns


def example_inputs(family: Family) -> torch.Tensor:
    """A batch of one input of the right kind for tracing (an image, or a few token ids)."""
    device = next(family.model.parameters()).device
    size = family.input_size()
    if size is not None:
        return torch.zeros(1, *size, device=device)
    return torch.arange(2, 10, device=device)[None]


def dependency_graph(family: Family) -> tp.DependencyGraph | None:
    """torch-pruning's graph of the model, or None when it cannot trace it (the direct cut is used)."""
    ignored = []
    for b in range(family.num_blocks):
        parts = family.block_parts(b)
        ignored += [n for n in (parts.q_norm, parts.k_norm) if n is not None]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tp.DependencyGraph().build_dependency(
                family.model, example_inputs=example_inputs(family), ignored_layers=ignored, verbose=False
            )
    except Exception:  # noqa: BLE001 - any tracing failure means: cut directly
        return None


def _cut_heads(graph: tp.DependencyGraph | None, family: Family, block: int, keep: list[int]) -> str:
    """Remove every head of `block` not in `keep`; return 'torch-pruning' or 'direct'."""
    heads = family.num_heads(block)
    drop = [h for h in range(heads) if h not in keep]
    slots = family.attention(block)
    if graph is not None and not slots.head_rows:
        cols = head_columns(torch.as_tensor(drop), family.head_dim(block)).tolist()
        group = graph.get_pruning_group(slots.o.get(), tp.prune_linear_in_channels, idxs=cols)
        cut = {id(dep.target.module): len(idxs) for dep, idxs in group if dep.handler == tp.prune_linear_out_channels}
        rows = 3 * len(cols) if len(slots.qkv) == 1 else len(cols)  # fused [q; k; v], or each projection
        if all(cut.get(id(s.get())) == rows for s in slots.qkv):
            group.prune()
            family.set_head_count(block, len(keep))
            return "torch-pruning"
    family.prune_heads_(block, keep)
    return "direct"


def _cut_units(graph: tp.DependencyGraph | None, family: Family, block: int, keep: list[int]) -> str:
    """Remove every MLP unit of `block` not in `keep`; return 'torch-pruning' or 'direct'."""
    mlp = family.mlp(block)
    drop = [u for u in range(mlp.fc1.get().out_features) if u not in set(keep)]
    if graph is not None:
        group = graph.get_pruning_group(mlp.fc1.get(), tp.prune_linear_out_channels, idxs=drop)
        if any(dep.target.module is mlp.fc2.get() for dep, _ in group):
            group.prune()
            return "torch-pruning"
    family.prune_mlp_units_(block, keep)
    return "direct"


def prune_physically(model: nn.Module, mask: HeadMask, cuts: dict[str, str] | None = None) -> nn.Module:
    """A copy of `model` with the heads (and MLP units) `mask` drops removed from its weights;
    no gates or hooks left. `cuts`, when given, receives how each cut was made
    ({"blocks.<b>.heads" or "blocks.<b>.mlp": "torch-pruning" or "direct"})."""
    pruned = copy.deepcopy(model)
    family = family_of(pruned)
    family.remove_gates()
    mask.validate(
        family.heads_per_block(), allow_empty_blocks=False, where="plain merger", mlp_widths=family.mlp_widths()
    )
    needs_heads = [b for b in range(family.num_blocks) if mask.num_kept()[b] < family.num_heads(b)]
    widths = family.mlp_widths()
    needs_units = [
        b for b in range(family.num_blocks) if mask.units is not None and len(mask.kept_units(b)) < widths[b]
    ]
    graph = dependency_graph(family) if needs_heads or needs_units else None
    how = cuts if cuts is not None else {}
    for b in needs_heads:
        how[f"blocks.{b}.heads"] = _cut_heads(graph, family, b, mask.kept_indices(b))
    for b in needs_units:
        how[f"blocks.{b}.mlp"] = _cut_units(graph, family, b, mask.kept_units(b))
    return pruned
