"""A small random DeepSeek-style MoE stack and a toy causal attention, for tests and benchmarks.

`ToyAttention` is a single-head causal attention over a per-request KV cache, so a request cut
in two chunks (two-chunk TBO) is computed correctly only if chunk 1 wrote its KV before chunk 2
reads it. Its math is batch-independent on CPU (see `rowwise`): every query reduces over the
request's whole fixed-size cache row with future slots masked, so the serial executor (all
tokens at once) and two micro-batches give bitwise equal outputs.

Legend: N batch tokens, H hidden, D head dim, Q requests, S max_len cache slots per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sglang_overlap.engine import rowwise
from sglang_overlap.engine.interfaces import Dispatcher
from sglang_overlap.engine.reference import ReferenceExperts
from sglang_overlap.engine.router import RouterConfig
from sglang_overlap.engine.stages import MicroBatch, MoeLayer


@dataclass(frozen=True)
class ToyWeights:
    """Global (all experts) weights of one MoE layer."""

    gate_w: torch.Tensor  # [E, H]
    bias: torch.Tensor  # [E] float32
    w13: torch.Tensor  # [E, 2I, H]
    w2: torch.Tensor  # [E, H, I]
    shared_w13: torch.Tensor | None  # [2I, H]
    shared_w2: torch.Tensor | None  # [H, I]


def toy_weights(
    num_layers: int, *, num_experts: int, hidden: int, inter: int, shared: bool = True,
    seed: int = 0, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
) -> list[ToyWeights]:
    """Random weights scaled so activations stay O(1) through a few layers."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(dtype=dtype, device=device)

    out = []
    for _ in range(num_layers):
        out.append(ToyWeights(
            gate_w=rnd(num_experts, hidden, scale=hidden**-0.5),
            bias=(torch.randn(num_experts, generator=g) * 0.1).to(device),
            w13=rnd(num_experts, 2 * inter, hidden, scale=hidden**-0.5),
            w2=rnd(num_experts, hidden, inter, scale=inter**-0.5 * 0.5),
            shared_w13=rnd(2 * inter, hidden, scale=hidden**-0.5) if shared else None,
            shared_w2=rnd(hidden, inter, scale=inter**-0.5 * 0.5) if shared else None,
        ))
    return out


def toy_layers(
    weights: Sequence[ToyWeights], router: RouterConfig, dispatcher: Dispatcher, *,
    rank: int = 0, world_size: int = 1,
) -> list[MoeLayer]:
    """MoeLayers holding this rank's slice [rank*E_local, (rank+1)*E_local) of the experts."""
    e_local = router.num_experts // world_size
    lo, hi = rank * e_local, (rank + 1) * e_local
    return [MoeLayer(router, w.gate_w, w.bias, ReferenceExperts(w.w13[lo:hi], w.w2[lo:hi]),
                     dispatcher, w.shared_w13, w.shared_w2) for w in weights]


class ToyAttention:
    """Single-head causal attention with a residual; usable as `stages.AttentionOps`.

    req_of_token [N] int64 and pos_of_token [N] int64 (absolute positions) describe the parent
    batch; slots below `prefix_lens[q]` of request q start filled with random cached KV.
    """

    def __init__(
        self, req_of_token: torch.Tensor, pos_of_token: torch.Tensor, prefix_lens: Sequence[int],
        *, num_layers: int, hidden: int, head_dim: int, max_len: int, seed: int = 0,
        device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.req = req_of_token.to(device)
        self.pos = pos_of_token.to(device)
        self.max_len = max_len
        q = len(prefix_lens)
        self.wqkv = [(torch.randn(3 * head_dim, hidden, generator=g) * hidden**-0.5).to(
            device=device, dtype=dtype) for _ in range(num_layers)]
        self.wo = [(torch.randn(hidden, head_dim, generator=g) * head_dim**-0.5 * 0.5).to(
            device=device, dtype=dtype) for _ in range(num_layers)]
        self.k_cache, self.v_cache = [], []
        for _ in range(num_layers):
            k = torch.randn(q, max_len, head_dim, generator=g)  # [Q, S, D]
            v = torch.randn(q, max_len, head_dim, generator=g)
            keep = torch.arange(max_len)[None, :] < torch.tensor(list(prefix_lens))[:, None]
            self.k_cache.append((k * keep[:, :, None]).to(device=device, dtype=dtype))
            self.v_cache.append((v * keep[:, :, None]).to(device=device, dtype=dtype))

    def _tokens(self, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        sl = slice(mb.token_start, mb.token_start + mb.num_tokens)
        return self.req[sl], self.pos[sl]  # [T], [T]

    def prepare(self, mb: MicroBatch, layer: int) -> None:
        """q/k/v projections; writes this micro-batch's K and V into the cache."""
        t = mb.num_tokens
        req, pos = self._tokens(mb)
        q, k, v = rowwise.linear(mb.hidden[:t], self.wqkv[layer]).chunk(3, dim=-1)  # [T, D] x3
        self.k_cache[layer][req, pos] = k
        self.v_cache[layer][req, pos] = v
        mb.state["attn_q"] = q

    def core(self, mb: MicroBatch, layer: int) -> None:
        """Causal attention of each query over its request's cache row; residual add."""
        t = mb.num_tokens
        req, pos = self._tokens(mb)
        q = mb.state.pop("attn_q")  # [T, D]
        acc = rowwise.acc_dtype(q.dtype)
        keys = self.k_cache[layer][req].to(acc)  # [T, S, D]
        vals_t = self.v_cache[layer][req].to(acc).transpose(1, 2).contiguous()  # [T, D, S]
        scores = (q.to(acc)[:, None, :] * keys).sum(-1) * q.shape[-1] ** -0.5  # [T, S]
        future = torch.arange(self.max_len, device=q.device)[None, :] > pos[:, None]  # [T, S]
        scores = scores.masked_fill(future, float("-inf"))
        e = torch.exp(scores - scores.max(-1, keepdim=True).values)  # [T, S]
        p = e / e.sum(-1, keepdim=True)
        ctx = (p[:, None, :] * vals_t).sum(-1).to(mb.hidden.dtype)  # [T, D]
        out = mb.hidden[:t] + rowwise.linear(ctx, self.wo[layer])  # [T, H]
        mb.hidden = torch.cat([out, mb.hidden[t:]])
