"""DeepGEMM expert runner: `interfaces.ExpertRunner` for both DeepEP layouts, and the choice of
signal-emitting down GEMM for single-batch overlap (SBO) on Hopper.

The kernels live in `deepgemm.py` (the only deep_gemm importer) and `signal_gemm.py` (Triton).

Legend: E local experts, C capacity rows per expert, R rows of the normal layout, H hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from sglang_overlap.kernels import fp8
from sglang_overlap.kernels.deepgemm import (
    Fp8ExpertWeights,
    api,
    num_sms_scope,
    run_contiguous_experts,
    run_masked_experts,
    sliced_masked_gemm_signal,
)
from sglang_overlap.kernels.signal_gemm import (
    SignalGemmConfig,
    default_config,
    grouped_gemm_fp8_signal,
)

if TYPE_CHECKING:
    from sglang_overlap.kernels.contracts import (
        LowLatencyDispatchOutput,
        NormalDispatchOutput,
        SignalContract,
    )


@dataclass(frozen=True)
class SignalPlan:
    """How the down GEMM emits SBO signals."""

    path: Literal["fused", "sliced"]
    """fused: the Triton kernel's per-tile atomics; sliced: DeepGEMM launches per expert slice."""
    slice_experts: int = 0
    """Experts per DeepGEMM launch (sliced only)."""
    streams: int = 1
    """Streams the slices alternate over (sliced only)."""


def choose_signal_path(num_local_experts: int, expected_m: int) -> SignalPlan:
    """The fastest signal-emitting down GEMM by the H200 table (benchmarks/gpu_suite.py,
    DeepSeek-V3 down projection, 2026-12-02): the fused Triton kernel for few experts while the
    GEMM is memory-bound (E < 16, <= 64 rows: 1.03-1.09x one DeepGEMM launch); DeepGEMM on E/4
    slices over two streams otherwise (0.95-1.04x), and on one stream in E/2 (E <= 16) or E/4
    slices at 256 rows and more (1.03-1.20x)."""
    e = num_local_experts
    if expected_m >= 256:
        return SignalPlan("sliced", max(1, e // 2 if e <= 16 else e // 4), 1)
    if e < 16 and expected_m <= 64:
        return SignalPlan("fused")
    return SignalPlan("sliced", max(1, e // 4), 2)


class DeepGemmExpertRunner:
    """`interfaces.ExpertRunner` on DeepGEMM fp8 (1x128 activation, 128x128 weight scales).

    With an SBO `signal`, the down GEMM bumps `signal.signal` in-kernel (fused Triton kernel or
    DeepGEMM slices, `choose_signal_path`); the counters reach `layout.expect_value` as units
    finish, for a kernel consumer (sgl-deep-ep's combine) to poll. `signal.mark` is not called
    (host-side bookkeeping is for torch producers): the contract is told the units are marked
    on the device, with an event after the GEMM for torch consumers.
    """

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        """w13 `[E, 2I, H]`, w2 `[E, H, I]` float (quantised here) on the GPU."""
        self.weights = Fp8ExpertWeights.quantize(w13, w2)

    def run_low_latency(self, dispatched: LowLatencyDispatchOutput, *,
                        signal: SignalContract | None = None) -> torch.Tensor:
        hidden = dispatched.hidden  # [E, C, H]
        x, x_scale = fp8.quant_per_token_group(hidden)
        down = None
        if signal is not None:
            down = self._signal_down(signal, dispatched.masked_m, dispatched.expected_m)
        out = run_masked_experts(x, x_scale, dispatched.masked_m, dispatched.expected_m,
                                 self.weights, down=down)
        out = out.to(hidden.dtype)
        if signal is not None:
            # The counters were bumped in-kernel; a torch consumer (the all-to-all dispatcher's
            # combine) waits for the whole GEMM through this event, a kernel consumer polls.
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(torch.cuda.current_stream(hidden.device))
            signal.marked_on_device(done)
        return out

    def _signal_down(self, signal: SignalContract, masked_m: torch.Tensor, expected_m: int
                     ) -> Any:
        lay = signal.layout
        plan = choose_signal_path(lay.num_local_experts, expected_m)
        base = default_config(expected_m)
        cfg = SignalGemmConfig(lay.block_m, lay.block_n, base.num_warps, base.num_stages,
                               max(1, base.ctas_per_sm), base.k_unroll)

        def down(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor,
                 out: torch.Tensor) -> None:
            if plan.path == "sliced" and a.shape[1] % 64 == 0:
                with num_sms_scope(lay.compute_num_sms):
                    sliced_masked_gemm_signal(a, a_s, b, b_s, out, masked_m, expected_m,
                                              signal=signal.signal, layout=lay,
                                              slice_experts=plan.slice_experts,
                                              streams=plan.streams)
            else:
                grouped_gemm_fp8_signal(a, a_s, b, b_s, masked_m, out, config=cfg,
                                        signal=signal.signal, layout=lay,
                                        num_programs=cfg.programs(lay.compute_num_sms))
        return down

    def run_normal(self, dispatched: NormalDispatchOutput) -> torch.Tensor:
        """Rows are re-laid into DeepGEMM's aligned contiguous layout and back, without a sync."""
        hidden, row_expert = dispatched.hidden, dispatched.row_expert.long()  # [R, H], [R]
        counts = dispatched.num_tokens_per_expert.long()  # [E]
        e, align, rows = counts.numel(), api().mk_alignment, hidden.shape[0]
        total = -(-(rows + e * align + 1) // align) * align
        trash = total - 1  # padding rows of the input land here; no expert's range reaches it
        aligned = -(-counts // align) * align
        starts = torch.cumsum(aligned, 0) - aligned  # [E]
        firsts = torch.cumsum(counts, 0) - counts  # [E] first valid row of each expert
        valid = row_expert >= 0
        rank = torch.cumsum(valid.long(), 0) - 1 - firsts[row_expert.clamp(min=0)]
        dest = torch.where(valid, starts[row_expert.clamp(min=0)] + rank, trash)  # [R]
        m_indices = torch.full((total,), -1, dtype=torch.int32, device=hidden.device)
        m_indices[dest] = row_expert.int()
        m_indices[trash] = -1
        x_pad = torch.zeros((total, hidden.shape[1]), dtype=hidden.dtype, device=hidden.device)
        x_pad[dest] = hidden
        x, x_scale = fp8.quant_per_token_group(x_pad)
        out = run_contiguous_experts(x, x_scale, m_indices, self.weights)  # [total, H]
        return torch.where(valid[:, None], out[dest], 0).to(hidden.dtype)
