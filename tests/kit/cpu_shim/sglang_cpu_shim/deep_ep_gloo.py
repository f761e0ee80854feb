"""DeepEP's low-latency dispatch and combine on torch.distributed (gloo on the CPU): the body
behind the kit's stand-in `deep_ep` packages (tests/kit/standins), whose `Buffer` methods carry
the installed trees' exact signatures and delegate here (normal mode: deep_ep_normal.py).

Legend (DeepEP's names): T tokens of this rank, K top-k, H hidden, E global experts, W ranks,
E_local = E / W, N num_max_dispatch_tokens_per_rank, C = N * W rows per local expert.

dispatch(x [T, H], topk_idx [T, K] int64 (-1 = unrouted), N, E, use_fp8)
    -> recv_x [E_local, C, H] (x's dtype), or with use_fp8 the pair (recv_x float8_e4m3fn,
       scales [E_local, C, H / 128] float32, one per 128 channels: x ~= recv_x * scale),
       recv_count [E_local] int32, handle. Row c of local expert e is valid iff
       c < recv_count[e]; valid rows are ordered by source rank, then token (DeepEP's order is
       unspecified; this one is fixed so runs are reproducible). Rows past the count are 0.
combine(x [E_local, C, H] expert outputs (unweighted), topk_idx [T, K] as dispatched,
        topk_weights [T, K] float32, handle)
    -> [T, H] in x's dtype = sum over k in k order, in float32, of w[t, k] * x[row of (t, k)].

Both calls finish their communication before returning (two all-gathers each); the receive
hook and the event are no-ops kept for the interface. Every rank must call them in the same
order (as with DeepEP, whose kernels also pair up across ranks).

Overlap (SBO): the combine's send reads an expert's rows only once the down GEMM has signalled
them. Here the GEMM has run to completion before the combine is called (one stream), so the
combine checks the signal instead of waiting on it: every signal unit covering valid rows must
have reached its expected value, else `SignalNotRaised` (on a GPU: a hang, or garbage sent).
  per expert: src_signals [E_local] int32, unit e complete iff src_signals[e] >=
              src_signal_expect_value (a signal GEMM raising one count per finished row block)
  per block:  comp_signal [E_local * ceil(C / block_m)] int32 (expert-major), block b of
              expert e (rows [b * block_m, (b + 1) * block_m)) complete iff its entry >=
              threshold; packed_recv_count must be this dispatch's recv_count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

FP8_GROUP = 128
FP8_MAX = 448.0
COUNTERS: Counter[str] = Counter()
"""Calls by kind ("dispatch", "combine" (low-latency), "normal_dispatch", "normal_combine",
"combine_overlap_per_expert", ...), for the tests."""


class SignalNotRaised(RuntimeError):
    """The combine was asked to overlap with a GEMM that did not signal every valid row."""


class EventOverlap:
    """DeepEP's event handle: nothing is asynchronous here."""

    def __init__(self, event: Any = None, extra_tensors: Any = None) -> None:
        self.event = event

    def current_stream_wait(self) -> None:
        return None

    def __enter__(self) -> EventOverlap:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _no_hook() -> None:
    return None


def quantize_fp8(x: torch.Tensor, round_scale: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., H] (H a multiple of 128) -> (float8_e4m3fn [..., H], float32 scales [..., H/128])
    with x ~= q * scale per 128-channel group; round_scale: scales rounded up to a power of 2."""
    *lead, h = x.shape
    if h % FP8_GROUP:
        raise ValueError(f"deep_ep stand-in: use_fp8 needs hidden % {FP8_GROUP} == 0, got {h}")
    g = x.float().reshape(*lead, h // FP8_GROUP, FP8_GROUP)
    scale = g.abs().amax(-1).clamp(min=1e-4) / FP8_MAX
    if round_scale:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (g / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(*lead, h), scale


class GlooLowLatency:
    """The two low-latency calls on `group` (module docstring)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.group_size = dist.get_world_size(group)

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        out = [torch.empty_like(t) for _ in range(self.group_size)]
        dist.all_gather(out, t.contiguous(), group=self.group)
        return torch.stack(out)

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, n: int, num_experts: int,
                 use_fp8: bool = False, round_scale: bool = False,
                 **_: Any) -> tuple[Any, torch.Tensor, tuple, EventOverlap, Callable[[], None]]:
        t, h = x.shape
        w = self.group_size
        if t > n:
            raise ValueError(f"deep_ep stand-in: {t} tokens > num_max_dispatch_tokens_per_rank "
                             f"{n}")
        if num_experts % w:
            raise ValueError(f"deep_ep stand-in: {num_experts} experts over {w} ranks")
        e_local = num_experts // w
        xs = x.new_zeros((n, h))
        xs[:t] = x
        ids = topk_idx.new_full((n, topk_idx.shape[1]), -1)
        ids[:t] = topk_idx
        all_x = self._gather(xs).reshape(w * n, h)  # row src * N + token
        all_ids = self._gather(ids).reshape(w * n, -1)
        recv = x.new_zeros((e_local, w * n, h))
        count = torch.zeros(e_local, dtype=torch.int32)
        src = torch.full((e_local, w * n), -1, dtype=torch.int64)  # src * N + token per row
        for e in range(e_local):
            rows = (all_ids == self.rank * e_local + e).any(-1).nonzero().squeeze(1)
            recv[e, : rows.numel()] = all_x[rows]
            count[e] = rows.numel()
            src[e, : rows.numel()] = rows
        COUNTERS["dispatch"] += 1
        handle = (src, count, t, n, num_experts)
        out: Any = quantize_fp8(recv, round_scale) if use_fp8 else recv
        return out, count, handle, EventOverlap(), _no_hook

    def combine(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                handle: tuple, overlap: bool = False, form: str | None = None,
                out: torch.Tensor | None = None,
                **signals: Any) -> tuple[torch.Tensor, EventOverlap, Callable[[], None]]:
        src, count, t, n, num_experts = handle
        if overlap:
            _check_signals(form, count, x.shape[1], signals)
            COUNTERS[f"combine_overlap_{form}"] += 1
        e_local = num_experts // self.group_size
        all_out = self._gather(x)  # [W, E_local, C, H]
        all_src = self._gather(src)  # [W, E_local, C]
        h = x.shape[-1]
        acc_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        pair = torch.zeros((t, topk_idx.shape[1], h), dtype=acc_dtype)  # [T, K, H]
        mine = (all_src >= 0) & (all_src // n == self.rank)
        for owner, e, c in mine.nonzero().tolist():
            tok = int(all_src[owner, e, c]) % n
            k = (topk_idx[tok] == owner * e_local + e).nonzero().squeeze(1)
            pair[tok, k] = all_out[owner, e, c].to(acc_dtype)
        acc = torch.zeros((t, h), dtype=acc_dtype)
        w = topk_weights.to(acc_dtype)
        for j in range(topk_idx.shape[1]):
            acc = acc + torch.where((topk_idx[:, j] >= 0)[:, None], w[:, j, None] * pair[:, j],
                                    0.0)
        COUNTERS["combine"] += 1
        if out is None:
            return acc.to(x.dtype), EventOverlap(), _no_hook
        out.copy_(acc)  # the caller's buffer (DeepEP's `out`), returned as the result
        return out, EventOverlap(), _no_hook


def _check_signals(form: str | None, count: torch.Tensor, capacity: int,
                   signals: dict[str, Any]) -> None:
    if form == "per_expert":
        sig, expect = signals["src_signals"], int(signals["src_signal_expect_value"])
        if sig is None:
            raise SignalNotRaised("overlap=True without src_signals")
        low = [e for e in range(count.numel()) if count[e] > 0 and int(sig[e]) < expect]
        if low:
            raise SignalNotRaised(f"experts {low}: src_signals {sig.tolist()} < {expect}")
        return
    if form != "per_block":
        raise ValueError(f"deep_ep stand-in: unknown overlap form {form!r}")
    sig, block_m = signals["comp_signal"], int(signals["block_m"])
    threshold, packed = int(signals["threshold"]), signals["packed_recv_count"]
    if sig is None or packed is None:
        raise SignalNotRaised("overlap=True without comp_signal / packed_recv_count")
    if not torch.equal(packed.to(count.dtype), count):
        raise SignalNotRaised(f"packed_recv_count {packed.tolist()} != recv_count "
                              f"{count.tolist()}")
    blocks = -(-capacity // block_m)
    for e in range(count.numel()):
        used = -(-int(count[e]) // block_m)
        got = sig[e * blocks : e * blocks + used]
        if used and int(got.min()) < threshold:
            raise SignalNotRaised(f"expert {e}: comp_signal {got.tolist()} < {threshold}")


class Config:
    """deep_ep.Config (the normal-mode tuning knobs): kept, never used here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        return 0

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        return 0


class BufferBase:
    """Everything of deep_ep.Buffer but the calls whose signatures each stand-in tree declares
    itself (the two low-latency calls, the normal-mode configs, layout, dispatch and combine);
    those delegate to `_ll` (this module) and `_normal_*` (deep_ep_normal.py)."""

    num_sms: int = 20

    def __init__(self, group: Any, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                 low_latency_mode: bool = False, **_: Any) -> None:
        from sglang_cpu_shim.deep_ep_normal import GlooNormal

        if group is None:
            raise ValueError("deep_ep stand-in: needs a torch.distributed group")
        self.group = group
        self.low_latency_mode = low_latency_mode
        self.num_nvl_bytes, self.num_rdma_bytes = num_nvl_bytes, num_rdma_bytes
        self._ll = GlooLowLatency(group)
        self._normal = GlooNormal(group)
        self.rank, self.group_size = self._ll.rank, self._ll.group_size

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        BufferBase.num_sms = new_num_sms

    @staticmethod
    def capture() -> EventOverlap:
        return EventOverlap()

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int,
                                       num_ranks: int, num_experts: int) -> int:
        """Bytes DeepEP would ask for (bf16 rows, two buffers); nothing is allocated here."""
        n = num_max_dispatch_tokens_per_rank
        return 2 * (num_experts // num_ranks) * n * num_ranks * hidden * 2

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int,
                                 num_experts: int) -> None:
        return None

    def _normal_layout(self, topk_idx: torch.Tensor, num_experts: int) -> tuple:
        from sglang_cpu_shim.deep_ep_normal import layout

        return (*layout(topk_idx, num_experts, self.group_size), EventOverlap())

    def _normal_dispatch(self, x: Any, handle: Any, is_token_in_rank: Any,
                         num_tokens_per_expert: Any, topk_idx: Any, topk_weights: Any,
                         expert_alignment: int, num_worst_tokens: int) -> tuple:
        if handle is not None or num_worst_tokens:
            raise NotImplementedError("deep_ep stand-in: cached dispatch (handle) and "
                                      "num_worst_tokens are not emulated")
        if any(a is None for a in (topk_idx, topk_weights, is_token_in_rank,
                                    num_tokens_per_expert)):
            raise ValueError("deep_ep stand-in: dispatch needs topk_idx, topk_weights and the "
                             "layout (get_dispatch_layout)")
        num_experts = num_tokens_per_expert.numel()  # [E], as DeepEP reads it
        return (*self._normal.dispatch(x, topk_idx, topk_weights, is_token_in_rank,
                                       num_experts, expert_alignment), EventOverlap())

    def _normal_combine(self, x: torch.Tensor, handle: tuple, topk_weights: Any,
                        bias: Any) -> tuple:
        return (*self._normal.combine(x, handle, topk_weights, bias), EventOverlap())
