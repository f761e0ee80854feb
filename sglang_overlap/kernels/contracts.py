"""The contracts between the MoE stages and their backends: dispatcher, expert runner, SBO signal.

Backends implement these: `reference.py` (pure torch, EP = 1), `a2a.py` (torch.distributed
all-to-all, any number of ranks), `deepep.py` (DeepEP buffers) and `deepgemm.py` (DeepGEMM
grouped GEMMs). The stages in `stages.py` only ever talk to these protocols.

Legend (DeepEP's names):
    T        tokens of this rank's micro-batch (0 on an idle rank)
    K        num_topk, experts per token
    H        hidden size
    I        moe_intermediate_size (one expert's SwiGLU width)
    E        global routed experts; E_local = E // world_size;
             rank r owns experts [r*E_local, (r+1)*E_local)
    C        capacity: static rows per local expert in the low-latency layout
             (num_max_dispatch_tokens_per_rank * world_size, as DeepEP sizes its LL buffer)
    R        rows received by this rank in the normal layout (one per routed (token, k) pair,
             grouped by local expert; backends that align groups add padding rows)

Who applies the top-k weights: never the expert runner. Expert runners return the UNWEIGHTED
expert output of every row; the dispatcher's combine multiplies by `topk_weights` and sums a
token's K contributions in k order (k = 0, 1, ..., K-1), skipping unrouted slots. A fixed order
keeps results independent of how a batch is split into micro-batches.

Two-phase calls mirror DeepEP: `*_send` issues the communication and returns at once with a
pending handle; `*_recv` completes it. Everything another micro-batch does between the two
calls overlaps with the transfer. `slot` (0 or 1) names the micro-batch, like SGLang's
`tbo_subbatch_index`, so a backend can keep one buffer per micro-batch in flight; serial and
SBO execution use slot 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch

Layout = Literal["low_latency", "normal"]
"""DeepEP's two modes: low_latency = padded [E_local, C, H] + masked counts (decode),
normal = contiguous rows grouped by expert + per-expert counts (prefill)."""


@dataclass(frozen=True)
class LowLatencyDispatchOutput:
    """What a rank's experts receive in the low-latency layout (DeepEP `low_latency_dispatch`)."""

    hidden: torch.Tensor
    """[E_local, C, H] activations dtype. Row c of expert e is valid iff c < masked_m[e];
    rows past masked_m[e] are garbage (backends may leave stale data there)."""
    masked_m: torch.Tensor
    """[E_local] int32, device: valid rows per local expert (DeepEP `packed_recv_count`)."""
    expected_m: int
    """Host int: a hint for the GEMM's M tiling, about the mean rows per local expert. SGLang
    passes (T * world_size * K + E) // E; the torch all-to-all (`a2a.py`) passes
    (rows received + E_local) // E_local, the same on balanced routing."""
    handle: Any
    """Backend-private state that `combine_send` needs (DeepEP's `handle`)."""


@dataclass(frozen=True)
class NormalDispatchOutput:
    """What a rank's experts receive in the normal layout (DeepEP `dispatch`, then SGLang's
    `ep_scatter` into DeepGEMM's contiguous layout)."""

    hidden: torch.Tensor
    """[R, H] activations dtype: one row per routed (token, k) pair that targets a local expert,
    rows grouped by local expert in increasing expert order."""
    row_expert: torch.Tensor
    """[R] int32, device: the local expert of each row; -1 = padding row (DeepGEMM `m_indices`)."""
    num_tokens_per_expert: torch.Tensor
    """[E_local] int32, device: rows per local expert, padding rows excluded."""
    handle: Any
    """Backend-private state that `combine_send` needs."""


DispatchOutput = LowLatencyDispatchOutput | NormalDispatchOutput


@runtime_checkable
class Dispatcher(Protocol):
    """Moves routed token rows to the ranks owning their experts and the results back."""

    world_size: int
    num_experts: int
    """E, global routed experts."""

    def dispatch_send(
        self,
        hidden: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        *,
        layout: Layout,
        slot: int,
    ) -> Any:
        """Issue the dispatch of one micro-batch; returns a pending handle for `dispatch_recv`.

        hidden:       [T, H] activations dtype, this rank's tokens (T may be 0).
        topk_ids:     [T, K] int64 global expert ids, -1 = unrouted.
        topk_weights: [T, K] float32 combine weights (routed scaling already applied).
        """
        ...

    def dispatch_recv(self, pending: Any) -> DispatchOutput:
        """Complete the dispatch; the output layout is the one asked for in `dispatch_send`."""
        ...

    def combine_send(
        self,
        expert_out: torch.Tensor,
        dispatched: DispatchOutput,
        *,
        signal: SignalContract | None = None,
    ) -> Any:
        """Issue the combine of one micro-batch; returns a pending handle for `combine_recv`.

        expert_out: unweighted expert outputs in the layout of `dispatched`:
                    [E_local, C, H] (low latency) or [R, H] (normal), activations dtype.
        signal:     SBO only (low latency). The backend must not read a unit of `expert_out`
                    before the unit is marked: torch backends call `signal.wait(unit)` before
                    reading the unit's rows; kernel backends poll `signal.signal` until it
                    equals `signal.layout.expect_value`.
        """
        ...

    def combine_recv(self, pending: Any) -> torch.Tensor:
        """Complete the combine: [T, H] activations dtype, sum_k topk_weights[t, k] * out[t, k]
        in k order over routed k (a token with no routed k gets zeros)."""
        ...


@runtime_checkable
class ExpertRunner(Protocol):
    """Routed experts (SwiGLU: down(silu(gate) * up)) for the local experts of one rank.

    Weights follow SGLang's fused layout: w13 [E_local, 2I, H] (gate rows first, then up rows),
    w2 [E_local, H, I]. Outputs are unweighted (see the module docstring).
    """

    def run_low_latency(
        self, dispatched: LowLatencyDispatchOutput, *, signal: SignalContract | None = None
    ) -> torch.Tensor:
        """[E_local, C, H] -> [E_local, C, H]; rows past masked_m[e] are unspecified.

        With `signal` (SBO), the down GEMM marks each unit of `signal.layout` once the unit's
        output rows are final (`signal.mark(unit)`, or in-kernel for kernel backends), and
        the caller may start `combine_send` before this returns its last unit; see
        `SignalContract`.
        """
        ...

    def run_normal(self, dispatched: NormalDispatchOutput) -> torch.Tensor:
        """[R, H] -> [R, H]; padding rows (row_expert == -1) are unspecified."""
        ...


# The SBO signal contract lives in its own module (it carries the CPU/CUDA mechanics) but is
# part of this interface.
from sglang_overlap.kernels.signals import SignalContract  # noqa: E402

__all__ = [
    "Dispatcher",
    "DispatchOutput",
    "ExpertRunner",
    "Layout",
    "LowLatencyDispatchOutput",
    "NormalDispatchOutput",
    "SignalContract",
]
