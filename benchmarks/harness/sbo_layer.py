"""One MoE layer on the real kernel stack, with SGLang's single-batch-overlap (SBO) schedule.

DeepEP low-latency dispatch (fp8) -> DeepGEMM masked gate-up -> SiLU-and-mul + fp8 quant ->
down GEMM -> DeepEP low-latency combine, plus a bf16 shared expert. `forward(mode=)`:

  serial   every stage after the previous one (the reference)
  shared   overlap 1: the shared expert between the dispatch send and its receive hook
  sbo      overlap 1 + overlap 2: the plugin's signal down GEMM (`down_gemm.signal_down_gemm`)
           on `layout.compute_num_sms` SMs, and the combine send on the communication stream
           with `overlap=True`, polling that signal in the form the installed tree takes

The launch order of overlap 2 is what makes it hang-free (tests/gpu/test_sbo_layer.py):
  1. zero the signal on the compute stream, record `ready`;
  2. launch the whole producer there (every GEMM launch and signal store);
  3. the communication stream waits for `ready`, then the combine send is launched;
  4. the receive hook runs on the communication stream too (DeepEP launches it on the send's
     stream), and the compute stream waits for it before reading the result.
The send therefore never precedes its producer in any stream, and every kernel the signal
depends on is launched - so loaded: CUDA's lazy loading may synchronise the context at a
kernel's first launch, and that waits for a spinning send - before the send can spin. The send
holds `combine_send_num_sms` whole SMs (cooperative grid); the producer is not cooperative and
is sized for the other SMs, so it progresses whatever the send holds. Whatever the order a
caller picks, `combine_send` first builds and loads the producer's module
(`down_gemm.prepare_signal_down_gemm`: the patched DeepGEMM kernel is one module per shape, and
loading one while a send spins waits for the device to go idle - seen on the H200).

Legend: T tokens of this rank, K top-k, H hidden, I moe intermediate, E global experts,
L = E_local local experts, N num_max_dispatch_tokens_per_rank, W ranks, C = N * W.
Only the caller imports deep_ep: the layer takes its `Buffer`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

import torch

from benchmarks.harness.sbo_watchdog import WATCHDOG_ENV, wait_or_raise
from sglang_overlap.kernels import deepgemm, fp8
from sglang_overlap.kernels.capabilities import device_num_sms as num_sms
from sglang_overlap.kernels.combine_overlap import layout_overlap_kwargs
from sglang_overlap.kernels.down_gemm import (
    DEEPGEMM_CAPACITY_ALIGN,
    combine_signal_layout,
    prepare_signal_down_gemm,
    signal_down_gemm,
)
from sglang_overlap.kernels.signals import new_signal
from sglang_overlap.planning.sbo_layout import SboLayout, default_comm_num_sms
from sglang_overlap.planning.sbo_path import CombineForm

Mode = Literal["serial", "shared", "sbo"]
MODES: tuple[Mode, ...] = ("serial", "shared", "sbo")


@dataclass(frozen=True)
class MoeShape:
    """The layer's static shape (DeepSeek-V3 defaults) and its DeepEP buffer's limits."""

    num_experts: int  # E, global routed experts
    world_size: int = 1
    hidden: int = 7168
    inter: int = 2048  # moe_intermediate_size (one expert's SwiGLU width)
    shared_inter: int = 2048  # n_shared_experts * moe_intermediate_size
    top_k: int = 8
    num_max_dispatch_tokens_per_rank: int = 256  # N; C = N * W must be a multiple of 64

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.world_size

    @property
    def capacity(self) -> int:
        return self.num_max_dispatch_tokens_per_rank * self.world_size

    def expected_m(self, num_tokens: int) -> int:
        """SGLang's hint: (T * W * K + E) // E rows per local expert."""
        return (num_tokens * self.world_size * self.top_k + self.num_experts) // self.num_experts


@dataclass(frozen=True)
class MoeWeights:
    experts: deepgemm.Fp8ExpertWeights  # [L, 2I, H] / [L, H, I] fp8 + 128x128 scales
    shared_w13: torch.Tensor  # [2 * shared_inter, H] bf16
    shared_w2: torch.Tensor  # [H, shared_inter] bf16

    @classmethod
    def random(cls, shape: MoeShape, seed: int, device: str = "cuda") -> MoeWeights:
        gen = torch.Generator(device=device).manual_seed(seed)
        h, i, s, e = shape.hidden, shape.inter, shape.shared_inter, shape.num_local_experts

        def w(*dims: int) -> torch.Tensor:
            return torch.randn(dims, generator=gen, device=device) / dims[-1] ** 0.5

        return cls(deepgemm.Fp8ExpertWeights.quantize(w(e, 2 * i, h), w(e, h, i)),
                   w(2 * s, h).bfloat16(), w(h, s).bfloat16())


@dataclass
class Dispatched:
    x: torch.Tensor  # [L, C, H] fp8 (or bf16)
    x_scale: torch.Tensor | None  # [L, C, H/128] fp32, MN-major (DeepEP's layout)
    count: torch.Tensor  # [L] int32 valid rows per local expert
    handle: Any  # DeepEP's combine handle
    expected_m: int


class DeepEPSboLayer:
    """The layer over a DeepEP `Buffer` sized for `shape` (low-latency mode)."""

    def __init__(self, buffer: Any, shape: MoeShape, weights: MoeWeights, *,
                 form: CombineForm | None,
                 comm_num_sms: int = default_comm_num_sms(blackwell=False),
                 watchdog_s: float | None = None) -> None:
        if shape.capacity % DEEPGEMM_CAPACITY_ALIGN:
            raise ValueError(f"DeepGEMM's masked GEMM needs C = N * W a multiple of "
                             f"{DEEPGEMM_CAPACITY_ALIGN} (got {shape.capacity})")
        self.buffer, self.shape, self.weights, self.form = buffer, shape, weights, form
        self.comm_num_sms = comm_num_sms
        self.num_sms = num_sms()
        env = os.environ.get(WATCHDOG_ENV)
        self.watchdog_s = watchdog_s if watchdog_s is not None else (float(env) if env else None)
        self.comm_stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]

    # stages --------------------------------------------------------------------------------
    def dispatch_send(self, x: torch.Tensor, topk_idx: torch.Tensor, *,
                      use_fp8: bool = True) -> tuple[Any, Any]:
        """x [T, H] bf16, topk_idx [T, K] int64 (-1 = unrouted) -> (pending, receive hook)."""
        s = self.shape
        recv, count, handle, _event, hook = self.buffer.low_latency_dispatch(
            x, topk_idx, s.num_max_dispatch_tokens_per_rank, s.num_experts, use_fp8=use_fp8,
            async_finish=False, return_recv_hook=True)
        return (recv, count, handle, s.expected_m(x.shape[0])), hook

    @staticmethod
    def dispatched(pending: Any) -> Dispatched:
        recv, count, handle, expected_m = pending
        x, scale = recv if isinstance(recv, tuple) else (recv, None)
        return Dispatched(x, scale, count, handle, expected_m)

    def shared_expert(self, x: torch.Tensor) -> torch.Tensor:
        """[T, H] bf16 -> [T, H] bf16: down(silu(gate x) * up x)."""
        gate_up = x @ self.weights.shared_w13.t()  # [T, 2S]
        gate, up = gate_up.chunk(2, dim=-1)
        return (torch.nn.functional.silu(gate) * up) @ self.weights.shared_w2.t()

    def experts_up(self, d: Dispatched) -> tuple[torch.Tensor, torch.Tensor]:
        """Gate-up GEMM + SiLU-and-mul + fp8 quant -> ([L, C, I] fp8, [L, C, I/128] fp32)."""
        if d.x_scale is None:
            x, x_scale = fp8.quant_per_token_group(d.x)
        else:
            x, x_scale = d.x, d.x_scale
        w = self.weights.experts
        up = torch.empty((*x.shape[:2], w.w13.shape[1]), dtype=torch.bfloat16, device=x.device)
        deepgemm.masked_gemm(x, x_scale, w.w13, w.w13_scale, up, d.count, d.expected_m)
        return fp8.silu_and_mul_quant(up, d.count)

    def layout(self, num_tokens: int) -> SboLayout:
        """The signal the combine of `self.form` reads, and the SM split, for T tokens."""
        if self.form is None:
            raise ValueError("this deep_ep has no combine overlap form: mode 'sbo' needs one")
        s = self.shape
        return combine_signal_layout(
            self.form, num_local_experts=s.num_local_experts, world_size=s.world_size,
            num_max_dispatch_tokens_per_rank=s.num_max_dispatch_tokens_per_rank,
            num_tokens=num_tokens, hidden=s.hidden, expected_m=s.expected_m(num_tokens),
            num_sms=self.num_sms, comm_num_sms=self.comm_num_sms)

    def down(self, act: tuple[torch.Tensor, torch.Tensor], d: Dispatched, *,
             signal: torch.Tensor | None = None, layout: SboLayout | None = None,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """[L, C, I] -> `out` [L, C, H] bf16 on the current stream; with `signal`, the served
        signal down GEMM on `layout.compute_num_sms` SMs raising it unit by unit."""
        a, a_s = act
        w = self.weights.experts
        if out is None:
            out = torch.empty((*a.shape[:2], w.w2.shape[1]), dtype=torch.bfloat16,
                              device=a.device)
        if signal is None:
            deepgemm.masked_gemm(a, a_s, w.w2, w.w2_scale, out, d.count, d.expected_m)
        else:
            assert layout is not None
            signal_down_gemm(a, a_s, w.w2, w.w2_scale, out, d.count, d.expected_m,
                             signal=signal, layout=layout)
        return out

    def combine_send(self, out: torch.Tensor, d: Dispatched, topk_idx: torch.Tensor,
                     topk_w: torch.Tensor, *, signal: torch.Tensor | None = None,
                     layout: SboLayout | None = None) -> tuple[torch.Tensor, Any]:
        """The combine's send phase on the current stream -> (combined [T, H], receive hook)."""
        kwargs: dict[str, Any] = {}
        if signal is not None:
            assert layout is not None and self.form is not None
            # the producer's kernel must be loaded before a send spins on its signal
            prepare_signal_down_gemm(layout, d.expected_m, self.weights.experts.w2.shape[2],
                                     out.device)
            kwargs = layout_overlap_kwargs(self.form, layout, signal, d.count,
                                           num_sms=layout.comm_num_sms)
        combined, _event, hook = self.buffer.low_latency_combine(
            out, topk_idx, topk_w, d.handle, async_finish=False, return_recv_hook=True, **kwargs)
        return combined, hook

    # the schedule --------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor,
                mode: Mode = "sbo") -> torch.Tensor:
        """x [T, H] bf16, topk_idx [T, K] int64 (-1 = unrouted), topk_w [T, K] fp32 ->
        [T, H] bf16 = shared(x) + sum_k w[t, k] * expert_k(x[t])."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES} (got {mode!r})")
        if mode == "sbo" and torch.cuda.current_stream() == self.comm_stream:
            raise ValueError("the combine send and its producer GEMM must be on different "
                             "streams (one stream orders the send before or after the whole "
                             "GEMM: no overlap, or a hang); call forward off layer.comm_stream")
        pending, hook = self.dispatch_send(x, topk_idx)
        if mode == "serial":
            hook()
            shared = self.shared_expert(x)
        else:  # overlap 1: the shared expert runs while the dispatch is in flight
            shared = self.shared_expert(x)
            hook()
        d = self.dispatched(pending)
        act = self.experts_up(d)
        if mode != "sbo" or self.form is None:
            out = self.down(act, d)
            combined, chook = self.combine_send(out, d, topk_idx, topk_w)
            chook()
            return combined + shared
        return self._overlapped_down_combine(act, d, topk_idx, topk_w) + shared

    def _overlapped_down_combine(self, act: tuple[torch.Tensor, torch.Tensor], d: Dispatched,
                                 topk_idx: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        compute = torch.cuda.current_stream()
        layout = self.layout(topk_idx.shape[0])
        signal = new_signal(layout, act[0].device)  # 1. zeroed on the compute stream
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record(compute)
        out = self.down(act, d, signal=signal, layout=layout)  # 2. the whole producer
        self.comm_stream.wait_event(ready)  # 3. then the send, beside it
        with torch.cuda.stream(self.comm_stream):
            combined, chook = self.combine_send(out, d, topk_idx, topk_w, signal=signal,
                                                layout=layout)
            sent = torch.cuda.Event()  # type: ignore[no-untyped-call]
            sent.record(self.comm_stream)
        if not torch.cuda.is_current_stream_capturing():  # a graph keeps its pool alive
            for t in (out, signal, d.count, topk_idx, topk_w):
                t.record_stream(self.comm_stream)
        if self.watchdog_s is not None:
            wait_or_raise(sent, signal=signal, layout=layout, recv_count=d.count,
                          timeout_s=self.watchdog_s)
        self.combine_recv(chook)
        if not torch.cuda.is_current_stream_capturing():
            combined.record_stream(compute)
        return combined

    def combine_recv(self, chook: Any) -> None:
        """Run an overlapped combine's receive hook and make the current stream wait for it.
        DeepEP's hook launches on the stream its send ran on (the communication stream), not
        on the stream current at the call (SGLang's combine_b does the same three steps)."""
        compute = torch.cuda.current_stream()
        self.comm_stream.wait_stream(compute)
        with torch.cuda.stream(self.comm_stream):
            chook()
        compute.wait_stream(self.comm_stream)


__all__ = ["MODES", "DeepEPSboLayer", "Dispatched", "Mode", "MoeShape", "MoeWeights"]
