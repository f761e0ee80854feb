"""The harness's DeepEP: `HarnessDeepEPDispatcher`, the kernels' `Dispatcher` interface over a
DeepEP `Buffer` in low-latency and normal mode; buffer sizing; `load_deep_ep`. (SGLang's own
`DeepEPDispatcher` is what a server runs; this one only runs in tests/gpu and the benchmarks.)

The only harness module that imports `deep_ep` (lazily, in `HarnessDeepEPDispatcher.create`):
the dispatcher itself takes any object with DeepEP's `Buffer` methods, so the plumbing is
testable where DeepEP cannot load.

Legend (DeepEP's names): T tokens of this rank, K top-k, H hidden, E global experts,
E_local = E / W local experts, W ranks, N num_max_dispatch_tokens_per_rank, C = N * W
(rows per local expert in the low-latency receive buffer), Rt tokens received in normal mode.

Low latency (decode): `low_latency_dispatch(..., return_recv_hook=True)` only issues the RDMA
sends; the receive hook completes them. Combine likewise, with the SBO overlap arguments in the
form the installed `deep_ep` declares (see `combine_overlap_kwargs`). Normal (prefill): DeepEP
sends each token once per destination rank; this backend expands the received tokens into one
row per (token, k) pair targeting a local expert (the kernels' normal layout), and before the
combine reduces them per token with the top-k weights, because DeepEP's normal combine sums
without weights.

The DeepEP calls and their tensors (DeepEP's own documentation, sgl-deep-ep 0.1.2.post1):
  low_latency_dispatch(x, topk_idx, N, E, use_fp8=False, async_finish=False,
                       return_recv_hook=True) -> (recv_x, recv_count, handle, event, hook)
      x: [T, H] bf16, T <= N; topk_idx: [T, K] int64, -1 = unrouted
      recv_x: [E_local, C, H] bf16, row c of expert e valid iff c < recv_count[e]
      recv_count: [E_local] int32; hook(): completes the receive
  low_latency_combine(x, topk_idx, topk_weights, handle, async_finish=False,
                      return_recv_hook=True, **overlap) -> (combined_x, event, hook)
      x: [E_local, C, H] bf16 expert outputs (unweighted); topk_idx: [T, K] int64 as dispatched;
      topk_weights: [T, K] float32; combined_x: [T, H] bf16 = sum_k w[t, k] * out[t, k]
  get_dispatch_layout(topk_idx, E, previous_event, async_finish=True,
                      allocate_on_comm_stream=True)
      -> (num_tokens_per_rank [W] int32, num_tokens_per_rdma_rank [W/8] int32 | None,
          num_tokens_per_expert [E] int32, is_token_in_rank [T, W] bool, event)
  dispatch(x, topk_idx=, topk_weights=, <the four layout tensors>, previous_event=,
           async_finish=True, allocate_on_comm_stream=True)
      -> (recv_x [Rt, H] bf16, recv_topk_idx [Rt, K] int64 local ids, -1 = not on this rank,
          recv_topk_weights [Rt, K] float32 (0 where -1), num_recv_tokens_per_expert list,
          handle, event)
  combine(x [Rt, H] bf16, handle, previous_event=, async_finish=True,
          allocate_on_comm_stream=True) -> (combined_x [T, H] bf16 (a plain sum), None, event)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sglang_overlap.kernels.combine_overlap import combine_overlap_kwargs
from sglang_overlap.kernels.contracts import (
    Layout,
    LowLatencyDispatchOutput,
    NormalDispatchOutput,
    SignalContract,
)
from sglang_overlap.kernels.layouts import PackInfo, pack, unpack, weighted_sum
from sglang_overlap.planning.sbo_layout import default_comm_num_sms
from sglang_overlap.planning.sbo_path import CombineForm

MAX_DISPATCH_TOKENS_PER_RANK = 1024  # SGLang 0.5.23 asserts this bound on the LL buffer
ENV_MAX_DISPATCH = "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"


@dataclass(frozen=True)
class DeepEPBufferPlan:
    """How big DeepEP's buffer must be, from the model and the batch limits."""

    hidden: int
    num_experts: int
    world_size: int
    num_max_dispatch_tokens_per_rank: int  # N: the most tokens one rank sends in one LL call
    layouts: tuple[Layout, ...]
    num_qps_per_rank: int  # LL: E_local (DeepEP's rule); normal: its SM count; both: the max
    nvshmem_qp_depth: int  # >= 2 * (N + 1): DeepEP skips the WQ slot check on this premise
    normal_num_sms: int

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.world_size

    @property
    def capacity(self) -> int:
        """C: rows per local expert of the LL receive buffer [E_local, C, H]."""
        return self.num_max_dispatch_tokens_per_rank * self.world_size


def plan_deepep_buffer(*, hidden: int, num_experts: int, world_size: int,
                       max_batch_per_rank: int, tokens_per_seq: int = 1,
                       layouts: Sequence[Layout] = ("low_latency", "normal"),
                       normal_num_sms: int = 20) -> DeepEPBufferPlan:
    """N = max_batch_per_rank * tokens_per_seq (decode batch limit x draft tokens for verify).

    TBO does not shrink N: the buffer is shared by both micro-batches' calls, and an idle rank
    and a full one must agree on N.
    """
    for name, value in (("hidden", hidden), ("num_experts", num_experts),
                        ("world_size", world_size), ("max_batch_per_rank", max_batch_per_rank),
                        ("tokens_per_seq", tokens_per_seq), ("normal_num_sms", normal_num_sms)):
        if value < 1:
            raise ValueError(f"DeepEP buffer: {name} must be >= 1 (got {value})")
    if num_experts % world_size:
        raise ValueError(f"DeepEP buffer: num_experts={num_experts} must be a multiple of the "
                         f"expert-parallel size {world_size}")
    bad = [x for x in layouts if x not in ("low_latency", "normal")] or not layouts
    if bad:
        raise ValueError(f"DeepEP buffer: layouts must be low_latency and/or normal "
                         f"(got {tuple(layouts)})")
    n = max_batch_per_rank * tokens_per_seq
    if n > MAX_DISPATCH_TOKENS_PER_RANK:
        raise ValueError(
            f"DeepEP low-latency buffer: {max_batch_per_rank} sequences x {tokens_per_seq} tokens "
            f"= {n} tokens per rank exceeds {MAX_DISPATCH_TOKENS_PER_RANK} ({ENV_MAX_DISPATCH}); "
            "lower --cuda-graph-max-bs / --max-running-requests or the draft tokens")
    qps = {"low_latency": num_experts // world_size, "normal": normal_num_sms}
    return DeepEPBufferPlan(hidden, num_experts, world_size, n, tuple(layouts),
                            max(qps[x] for x in layouts), max(1024, 2 * (n + 1)),
                            normal_num_sms)


FORM_INSTALL = {
    "per_expert": "pip install sgl-deep-ep==0.1.2.post1 (built for torch >= 2.13), or build "
                  "deepseek-ai/DeepEP branch hybrid-ep (benchmarks/run_gpu.sh shows how)",
    "per_block": "build deepseek-ai/DeepEP branch antgroup-opt (DeepEP PR #483; no released "
                 "sgl-deep-ep has this form; benchmarks/run_gpu.sh shows how)",
}


def load_deep_ep(form: CombineForm | None = None) -> Any:
    """Import deep_ep at start-up, or raise RuntimeError naming the package found (version,
    location), what is wrong and what to install: not installed, no `low_latency_combine`
    taking `form`'s arguments (read from its source before loading anything), or an extension
    that fails to load (e.g. built for another torch / NCCL, or libnvshmem missing)."""
    from sglang_overlap.kernels.capabilities import DEEP_EP_COMBINE, combine_forms
    from sglang_overlap.kernels.package_source import probe_package

    found = probe_package(DEEP_EP_COMBINE[0], (DEEP_EP_COMBINE[1],))
    hint = FORM_INSTALL.get(form or "per_expert", FORM_INSTALL["per_expert"])
    if found.version is None:
        raise RuntimeError(f"deep_ep is not installed: {hint}")
    where = f"deep_ep {found.version} at {found.location}"
    forms = combine_forms(found.params)
    if form is not None and form not in forms:
        raise RuntimeError(f"{where}: low_latency_combine ({found.note}) takes "
                           f"{' and '.join(forms) or 'no'} overlap form(s), not {form}: {hint}")
    try:
        import deep_ep
    except Exception as exc:  # ImportError, OSError (.so), RuntimeError (host checks)
        raise RuntimeError(f"{where} does not load ({type(exc).__name__}: {exc}); its "
                           f"deep_ep_cpp extension must be built against this torch "
                           f"{torch.__version__} and NVSHMEM: {hint}") from exc
    return deep_ep


@dataclass
class _Pending:
    layout: Layout
    result: Any  # LL dispatch: (recv_x, recv_count, handle); combine: combined [T, H]
    hook: Any = None  # LL receive hook
    event: Any = None  # normal mode: DeepEP EventOverlap
    extra: Any = None


@dataclass(frozen=True)
class _Handle:
    deep_ep: Any  # DeepEP's handle for the combine
    topk_ids: torch.Tensor  # LL: [T, K] int64 as sent; normal: [Rt, K] received local ids
    topk_weights: torch.Tensor  # [T, K] / [Rt, K] float32
    recv_count: torch.Tensor | None = None  # LL: [E_local] int32 (per-block combine needs it)


class HarnessDeepEPDispatcher:
    """`Dispatcher` over a DeepEP `Buffer` (or anything with its methods)."""

    def __init__(self, buffer: Any, plan: DeepEPBufferPlan, *,
                 combine_form: CombineForm | None = None,
                 comm_num_sms: int = default_comm_num_sms(blackwell=False)) -> None:
        self.buffer = buffer
        self.plan = plan
        self.world_size = plan.world_size
        self.num_experts = plan.num_experts
        self.combine_form = combine_form
        self.comm_num_sms = comm_num_sms

    @classmethod
    def create(cls, group: Any, plan: DeepEPBufferPlan, *,
               combine_form: CombineForm | None = None) -> HarnessDeepEPDispatcher:
        """Allocate DeepEP's buffer for `plan` on `group` (imports deep_ep)."""
        from deep_ep import Buffer

        os.environ["NVSHMEM_QP_DEPTH"] = str(max(int(os.environ.get("NVSHMEM_QP_DEPTH", "0")),
                                                 plan.nvshmem_qp_depth))
        nvl = rdma = 0
        if "normal" in plan.layouts:
            Buffer.set_num_sms(plan.normal_num_sms)
            hidden_bytes = plan.hidden * 2  # bf16
            for cfg in (Buffer.get_dispatch_config(plan.world_size),
                        Buffer.get_combine_config(plan.world_size)):
                nvl = max(nvl, cfg.get_nvl_buffer_size_hint(hidden_bytes, plan.world_size))
                rdma = max(rdma, cfg.get_rdma_buffer_size_hint(hidden_bytes, plan.world_size))
        low_latency = "low_latency" in plan.layouts
        if low_latency:
            rdma = max(rdma, Buffer.get_low_latency_rdma_size_hint(
                plan.num_max_dispatch_tokens_per_rank, plan.hidden, plan.world_size,
                plan.num_experts))
        buffer = Buffer(group, nvl, rdma, low_latency_mode=low_latency,
                        num_qps_per_rank=plan.num_qps_per_rank)
        return cls(buffer, plan, combine_form=combine_form)

    # dispatch ------------------------------------------------------------------------------
    def dispatch_send(self, hidden: torch.Tensor, topk_ids: torch.Tensor,
                      topk_weights: torch.Tensor, *, layout: Layout, slot: int) -> _Pending:
        """hidden [T, H] bf16; topk_ids [T, K] int64 (-1 = unrouted); topk_weights [T, K] fp32.
        `slot` is not needed: DeepEP alternates its two LL buffers itself."""
        if layout not in self.plan.layouts:
            raise ValueError(f"DeepEP buffer was planned for {self.plan.layouts}, not {layout}")
        if layout == "low_latency":
            recv_x, recv_count, handle, _event, hook = self.buffer.low_latency_dispatch(
                hidden, topk_ids, self.plan.num_max_dispatch_tokens_per_rank, self.num_experts,
                use_fp8=False, async_finish=False, return_recv_hook=True)
            expected_m = ((hidden.shape[0] * self.world_size * topk_ids.shape[1]
                           + self.num_experts) // self.num_experts)
            return _Pending(layout, (recv_x, recv_count, handle), hook=hook,
                            extra=(topk_ids, topk_weights, expected_m))
        previous = self.buffer.capture()
        per_rank, per_rdma, per_expert, in_rank, previous = self.buffer.get_dispatch_layout(
            topk_ids, self.num_experts, previous_event=previous, async_finish=True,
            allocate_on_comm_stream=True)
        recv_x, recv_ids, recv_w, _counts, handle, event = self.buffer.dispatch(
            hidden, topk_idx=topk_ids, topk_weights=topk_weights, num_tokens_per_rank=per_rank,
            num_tokens_per_rdma_rank=per_rdma, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, previous_event=previous, async_finish=True,
            allocate_on_comm_stream=True)
        return _Pending(layout, (recv_x, recv_ids, recv_w, handle), event=event)

    def dispatch_recv(self, pending: _Pending) -> LowLatencyDispatchOutput | NormalDispatchOutput:
        if pending.layout == "low_latency":
            pending.hook()
            recv_x, recv_count, handle = pending.result  # [E_local, C, H], [E_local] int32
            topk_ids, topk_weights, expected_m = pending.extra
            return LowLatencyDispatchOutput(recv_x, recv_count, expected_m,
                                            _Handle(handle, topk_ids, topk_weights, recv_count))
        pending.event.current_stream_wait()
        recv_x, recv_ids, recv_w, handle = pending.result  # [Rt, H], [Rt, K] local ids, -1 = other
        rt, k = recv_ids.shape
        e_local = self.plan.num_local_experts
        flat = recv_ids.reshape(-1)  # [Rt*K]
        expert = torch.where(flat >= 0, flat, e_local)  # E_local = padding row
        rows = recv_x.repeat_interleave(k, dim=0)  # [Rt*K, H], row t*K + j
        return pack(rows, expert, num_local_experts=e_local, capacity=rt * k, layout="normal",
                    expected_m=0, handle_extra=_Handle(handle, recv_ids, recv_w))

    # combine -------------------------------------------------------------------------------
    def combine_send(self, expert_out: torch.Tensor,
                     dispatched: LowLatencyDispatchOutput | NormalDispatchOutput, *,
                     signal: SignalContract | None = None) -> _Pending:
        if isinstance(dispatched, LowLatencyDispatchOutput):
            h = dispatched.handle
            kwargs = self._overlap_kwargs(signal, h.recv_count)
            combined, _event, hook = self.buffer.low_latency_combine(
                expert_out, h.topk_ids, h.topk_weights, h.deep_ep, async_finish=False,
                return_recv_hook=True, **kwargs)
            return _Pending("low_latency", combined, hook=hook)
        info, h = dispatched.handle
        assert isinstance(info, PackInfo) and isinstance(h, _Handle)
        pair_out = unpack(expert_out, info)  # [Rt*K, H], row t*K + j
        local = weighted_sum(pair_out, h.topk_ids, h.topk_weights)  # [Rt, H]
        combined, _w, event = self.buffer.combine(
            local, h.deep_ep, previous_event=self.buffer.capture(), async_finish=True,
            allocate_on_comm_stream=True)
        return _Pending("normal", combined, event=event)

    def _overlap_kwargs(self, signal: SignalContract | None,
                        recv_count: torch.Tensor | None) -> dict[str, Any]:
        if signal is None:
            return {}
        want: CombineForm = "per_expert" if signal.layout.granularity == "expert" else "per_block"
        if self.combine_form != want:
            # No overlap form for this signal: combine only after every unit is final.
            signal.finish()
            for unit in range(signal.num_units):
                signal.wait(unit)
            return {}
        lay = signal.layout
        return combine_overlap_kwargs(want, signal=signal.signal, expect_value=lay.expect_value,
                                      packed_recv_count=recv_count, block_m=lay.block_m,
                                      threshold=lay.expect_value, num_sms=lay.comm_num_sms)

    def combine_recv(self, pending: _Pending) -> torch.Tensor:
        """[T, H] bf16: sum_k topk_weights[t, k] * out[t, k] over this rank's tokens."""
        if pending.layout == "low_latency":
            pending.hook()
        else:
            pending.event.current_stream_wait()
        result: torch.Tensor = pending.result
        return result


__all__ = [
    "FORM_INSTALL",
    "DeepEPBufferPlan",
    "HarnessDeepEPDispatcher",
    "load_deep_ep",
    "plan_deepep_buffer",
]
