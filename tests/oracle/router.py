"""DeepSeek-V3's router: sigmoid scores, correction bias, group-limited top-k, routed scaling.

Same math as SGLang's `biased_grouped_topk` (and the HF DeepSeek-V3 `MoEGate`):
    scores   = sigmoid(x @ gate_w.T)                                   [T, E]
    choice   = scores + e_score_correction_bias                         [T, E]
    group    = sum of the top-2 `choice` of each of n_group groups      [T, n_group]
    keep the topk_group best groups; top-k of `choice` inside them ->  topk_ids [T, K]
    weights  = scores[topk_ids] (the bias only chooses, never weighs), renormalised to sum 1
               if `renormalize`, times routed_scaling_factor             [T, K]
The gate GEMM and everything after it run in float32 for half-precision activations (float64
activations stay float64, for references).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_overlap.kernels import rowwise


@dataclass(frozen=True)
class RouterConfig:
    num_experts: int
    """E, global routed experts."""
    top_k: int
    """K, experts per token."""
    n_group: int = 1
    """Expert groups (DeepSeek-V3: 8); E % n_group == 0."""
    topk_group: int = 1
    """Groups a token may pick experts from (DeepSeek-V3: 4)."""
    routed_scaling_factor: float = 1.0
    """Multiplies the routed experts' weights (DeepSeek-V3: 2.5)."""
    renormalize: bool = True
    """Divide the K weights by their sum (DeepSeek-V3's norm_topk_prob)."""

    def __post_init__(self) -> None:
        e, g = self.num_experts, self.n_group
        if g < 1 or e % g:
            raise ValueError(f"router: num_experts={e} must be a multiple of n_group={g}")
        if not 1 <= self.topk_group <= g:
            raise ValueError(f"router: topk_group={self.topk_group} must be in [1, n_group={g}]")
        per_group = e // g
        if per_group < 2 and g > 1:
            raise ValueError(f"router: group scores use the top 2 experts per group; "
                             f"num_experts={e} / n_group={g} = {per_group} < 2")
        if not 1 <= self.top_k <= self.topk_group * per_group:
            raise ValueError(f"router: top_k={self.top_k} must be in [1, topk_group * "
                             f"experts_per_group = {self.topk_group * per_group}]")


def gate_logits(hidden: torch.Tensor, gate_w: torch.Tensor) -> torch.Tensor:
    """hidden [T, H] activations dtype, gate_w [E, H] -> logits [T, E] float32 (or float64)."""
    dtype = rowwise.acc_dtype(hidden.dtype)
    return rowwise.linear(hidden.to(dtype), gate_w.to(dtype))


def select_experts(
    logits: torch.Tensor, bias: torch.Tensor, cfg: RouterConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] float32, bias [E] float32 -> (topk_ids [T, K] int64, topk_weights [T, K]
    float32). Every token is routed to exactly K distinct experts (no -1 from this router)."""
    t, e = logits.shape
    scores = rowwise.sigmoid(logits)  # [T, E]
    choice = scores + bias.to(scores.dtype)  # [T, E]
    if cfg.n_group > 1:
        grouped = choice.view(t, cfg.n_group, e // cfg.n_group)  # [T, G, E/G]
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)  # [T, G]
        group_idx = group_scores.topk(cfg.topk_group, dim=-1).indices  # [T, topk_group]
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool)
        group_mask.scatter_(1, group_idx, True)
        expert_mask = group_mask[:, :, None].expand_as(grouped).reshape(t, e)  # [T, E]
        choice = choice.masked_fill(~expert_mask, float("-inf"))
    topk_ids = choice.topk(cfg.top_k, dim=-1).indices  # [T, K]
    weights = scores.gather(1, topk_ids)  # [T, K]
    if cfg.renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return topk_ids, weights * cfg.routed_scaling_factor
