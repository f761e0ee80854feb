"""DeepEP's normal-mode (intranode) layout, dispatch and combine on torch.distributed (gloo on
the CPU): the body behind the kit's stand-in `deep_ep` packages' `Buffer.get_dispatch_layout`,
`Buffer.dispatch` and `Buffer.combine`, whose signatures are the installed trees' (they
delegate here).

Legend (DeepEP's names): T tokens of this rank, K top-k, H hidden, E global experts, W ranks,
E_local = E / W (rank r owns experts [r * E_local, (r + 1) * E_local)), R tokens received.

layout(topk_idx [T, K] int64 (-1 = no selection), E)
    -> num_tokens_per_rank [W] int32 (tokens sending to each rank), None (no RDMA ranks:
       intranode), num_tokens_per_expert [E] int32, is_token_in_rank [T, W] bool (token t has
       an expert on rank r), all local (no communication), as DeepEP's.
dispatch(x [T, H] (or the pair fp8 [T, H] float8_e4m3fn, scales [T, H / 128] float32),
         topk_idx [T, K], topk_weights [T, K] float32, the layout above, expert_alignment)
    -> recv_x [R, H] (x's dtype, or the pair), recv_topk_idx [R, K] int64, recv_topk_weights
       [R, K] float32, num_recv_tokens_per_expert_list (Python list [E_local]), handle.
       Received rows: every token with an expert on this rank, once, in source-rank order, then
       in the source's token order (DeepEP's order within a source rank follows its channels,
       which keep token order). recv_topk_idx is the local expert id (global - rank * E_local)
       for experts of this rank, -1 otherwise; recv_topk_weights is the weight for experts of
       this rank, 0 otherwise (DeepEP's intranode kernel). The list counts, per local expert,
       the received rows routed to it, each rounded up to a multiple of expert_alignment.
       handle = (rank_prefix_matrix [W, W] int32: [i, j] = rows rank j receives from ranks
       0..i, None, None, recv_src_idx [R] int32: the row's token index on its source rank,
       is_token_in_rank [T, W], None): DeepEP's six slots, the channel-level ones unused here.
combine(x [R, H] one output per received row, handle, topk_weights [R, K] or None, bias)
    -> combined [T, H] in x's dtype: for each token, the sum (no weights: DeepEP's normal
       combine reduces only) over the ranks it went to, in rank order, in float32 (float64 for
       float64), of that rank's row for it, plus bias (0, 1 or 2 [T, H] tensors) after; tokens
       that went nowhere are 0. With topk_weights, also [T, K] float32, their sum likewise
       (non-local entries are 0, so each rank's weights come back); else None.

Each call finishes its communication before returning (all-gathers padded to the largest
rank); events are no-ops kept for the interface. Every rank must call dispatch and combine in
the same order, as with DeepEP. The cached dispatch (a handle passed back in) and
num_worst_tokens (CUDA-graph mode) are refused: SGLang's normal dispatcher uses neither.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from sglang_cpu_shim.deep_ep_gloo import COUNTERS


def layout(topk_idx: torch.Tensor, num_experts: int,
           num_ranks: int) -> tuple[torch.Tensor, None, torch.Tensor, torch.Tensor]:
    """DeepEP's get_dispatch_layout (module docstring)."""
    if num_experts % num_ranks:
        raise ValueError(f"deep_ep stand-in: {num_experts} experts over {num_ranks} ranks")
    e_local = num_experts // num_ranks
    owner = torch.where(topk_idx >= 0, topk_idx // e_local, -1)  # [T, K]
    in_rank = torch.stack([(owner == r).any(-1) for r in range(num_ranks)], dim=1)
    if in_rank.shape[0] == 0:
        in_rank = in_rank.reshape(0, num_ranks)
    per_rank = in_rank.sum(0).to(torch.int32)
    per_expert = torch.bincount(topk_idx[topk_idx >= 0], minlength=num_experts).to(torch.int32)
    return per_rank, None, per_expert, in_rank


class GlooNormal:
    """The normal-mode calls on `group` (module docstring)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.group_size = dist.get_world_size(group)

    def _gather_rows(self, t: torch.Tensor, rows: int) -> list[torch.Tensor]:
        """Every rank's `t` ([n_r, ...]), padded to `rows` rows for the all-gather, the padding
        cut off again using each rank's n_r (the caller gathers those first)."""
        wire = t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.bool) else t
        pad = wire.new_zeros((rows, *wire.shape[1:]))
        pad[: wire.shape[0]] = wire
        out = [torch.empty_like(pad) for _ in range(self.group_size)]
        dist.all_gather(out, pad, group=self.group)
        return [o.view(t.dtype) if wire is not t else o for o in out]

    def _sizes(self, n: int) -> list[int]:
        out = [torch.zeros(1, dtype=torch.int64) for _ in range(self.group_size)]
        dist.all_gather(out, torch.tensor([n], dtype=torch.int64), group=self.group)
        return [int(o) for o in out]

    def dispatch(self, x: Any, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                 is_token_in_rank: torch.Tensor, num_experts: int,
                 expert_alignment: int) -> tuple[Any, torch.Tensor, torch.Tensor, list[int],
                                                 tuple]:
        x, x_scales = x if isinstance(x, tuple) else (x, None)
        w, me = self.group_size, self.rank
        want = layout(topk_idx, num_experts, w)[3]
        if not torch.equal(want, is_token_in_rank.bool()):
            raise ValueError("deep_ep stand-in: is_token_in_rank is not the layout of topk_idx")
        sizes = self._sizes(x.shape[0])
        rows = max(max(sizes), 1)
        parts = [x, topk_idx, topk_weights.float(), is_token_in_rank.bool()]
        if x_scales is not None:
            parts.append(x_scales)
        got = [self._gather_rows(p, rows) for p in parts]
        e_local = num_experts // w
        begin = me * e_local
        recv: list[list[torch.Tensor]] = [[] for _ in parts]
        src_idx, per_src = [], []
        for s in range(w):
            take = got[3][s][: sizes[s], me].nonzero().squeeze(1)  # tokens of s for this rank
            per_src.append(take.numel())
            src_idx.append(take.to(torch.int32))
            for j in range(len(parts)):
                recv[j].append(got[j][s][take])
        recv_x, ids, wts = (torch.cat(r) for r in recv[:3])
        local = (ids >= begin) & (ids < begin + e_local)
        recv_ids = torch.where(local, ids - begin, -1)
        recv_w = torch.where(local, wts, 0.0)
        counts = [int((recv_ids == e).any(-1).sum()) for e in range(e_local)]
        aligned = [-(-c // expert_alignment) * expert_alignment for c in counts]
        all_per_src = torch.tensor(self._gather_counts(per_src), dtype=torch.int32)  # [W, W]
        handle = (all_per_src.cumsum(0).to(torch.int32), None, None, torch.cat(src_idx),
                  is_token_in_rank, None)
        COUNTERS["normal_dispatch"] += 1
        out_x = (recv_x, torch.cat(recv[4])) if x_scales is not None else recv_x
        return out_x, recv_ids, recv_w, aligned, handle

    def _gather_counts(self, per_src: list[int]) -> list[list[int]]:
        """[i][j] = rows rank j receives from rank i (each rank knows its own column)."""
        out = [torch.zeros(self.group_size, dtype=torch.int64) for _ in range(self.group_size)]
        dist.all_gather(out, torch.tensor(per_src, dtype=torch.int64), group=self.group)
        return [[int(out[j][i]) for j in range(self.group_size)] for i in range(self.group_size)]

    def combine(self, x: torch.Tensor, handle: tuple, topk_weights: torch.Tensor | None,
                bias: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        prefix, _, _, src_idx, in_rank, _ = handle
        if x.shape[0] != src_idx.numel():
            raise ValueError(f"deep_ep stand-in: combine got {x.shape[0]} rows, the dispatch "
                             f"received {src_idx.numel()}")
        w, me = self.group_size, self.rank
        t = in_rank.shape[0]
        sizes = self._sizes(x.shape[0])
        rows = max(max(sizes), 1)
        all_x = self._gather_rows(x, rows)
        all_w = (self._gather_rows(topk_weights.float(), rows)
                 if topk_weights is not None else None)
        acc_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        acc = torch.zeros((t, x.shape[1]), dtype=acc_dtype)
        acc_w = (torch.zeros((t, topk_weights.shape[1]), dtype=torch.float32)
                 if topk_weights is not None else None)
        for owner in range(w):  # rank order, as DeepEP's reduction over a token's ranks
            start = int(prefix[me - 1, owner]) if me else 0
            end = int(prefix[me, owner])
            mine = in_rank[:, owner].nonzero().squeeze(1)  # my tokens owner received, in order
            if mine.numel() != end - start:
                raise ValueError("deep_ep stand-in: combine handle does not match the dispatch")
            acc[mine] += all_x[owner][start:end].to(acc_dtype)
            if acc_w is not None and all_w is not None:
                acc_w[mine] += all_w[owner][start:end]
        for b in (bias if isinstance(bias, tuple) else (bias,)):
            if b is not None:
                acc = acc + b.to(acc_dtype)
        COUNTERS["normal_combine"] += 1
        return acc.to(x.dtype), acc_w
