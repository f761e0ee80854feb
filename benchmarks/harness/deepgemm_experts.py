"""DeepGEMM expert runner: `contracts.ExpertRunner` for both DeepEP layouts on fp8 kernels.

The kernels live in `deepgemm.py` (the only deep_gemm importer); with SBO the down GEMM is
`down_gemm.signal_down_gemm`, the same entry the SGLang glue serves.

Legend: E local experts, C capacity rows per expert, R rows of the normal layout, H hidden.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from sglang_overlap.kernels import fp8
from sglang_overlap.kernels.deepgemm import (
    Fp8ExpertWeights,
    api,
    run_contiguous_experts,
    run_masked_experts,
)
from sglang_overlap.kernels.down_gemm import signal_down_gemm

if TYPE_CHECKING:
    from sglang_overlap.kernels.contracts import (
        LowLatencyDispatchOutput,
        NormalDispatchOutput,
        SignalContract,
    )


class DeepGemmExpertRunner:
    """`contracts.ExpertRunner` on DeepGEMM fp8 (1x128 activation, 128x128 weight scales).

    With an SBO `signal`, the down GEMM (`down_gemm.signal_down_gemm`) raises `signal.signal` on
    the device; the counters reach `layout.expect_value` as units finish, for a kernel consumer
    (DeepEP's combine) to poll. `signal.mark` is not called
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
        def down(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor,
                 out: torch.Tensor) -> None:
            signal_down_gemm(a, a_s, b, b_s, out, masked_m, expected_m, signal=signal.signal,
                             layout=signal.layout)
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
