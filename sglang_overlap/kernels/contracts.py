"""The contracts between the MoE stages and their backends: dispatcher, expert runner, SBO signal.

Backends implement these. In the package: `a2a.AllToAllDispatcher` (torch.distributed
all-to-all, any number of ranks) and `experts.TorchExperts` (torch matmuls, what
`--moe-a2a-backend torch_a2a` serves). Outside it, with the tests and benchmarks: the pure-torch
oracle (an EP = 1 local dispatcher and reference experts) and the GPU harness (a DeepEP buffer
dispatcher and a DeepGEMM expert runner). The MoE stages that call a backend only ever talk to
these protocols, so any dispatcher runs with any expert runner.

"Activations dtype" below is the model's activation dtype (bf16 on GPU; float32 or bf16 on CPU):
dispatch and combine move activations unquantised; an expert runner that computes in fp8
quantises its input itself.

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
    """`[E_local, C, H]` activations dtype, contiguous, on the device. Row c of expert e is valid
    iff c < masked_m[e]; rows past masked_m[e] are garbage (backends may leave stale data
    there)."""
    masked_m: torch.Tensor
    """`[E_local]` int32, on the device: valid rows per local expert, each <= C (DeepEP
    `packed_recv_count`)."""
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
    """`[R, H]` activations dtype, on the device: one row per routed (token, k) pair that targets
    a local expert, rows grouped by local expert in increasing expert order."""
    row_expert: torch.Tensor
    """`[R]` int32, on the device: the local expert (in [0, E_local)) of each row; -1 = padding
    row (DeepGEMM's `m_indices`)."""
    num_tokens_per_expert: torch.Tensor
    """`[E_local]` int32, on the device: rows per local expert, padding rows excluded."""
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
        """Issue the dispatch of one micro-batch and return without waiting for it.

        Arguments:
            hidden: `torch.Tensor` `[T, H]` in the activations dtype, this rank's tokens. T may
                be 0: an idle rank still calls, so that every rank issues the same collectives.
            topk_ids: `torch.Tensor` `[T, K]` int64, global expert ids in [0, E); -1 = an
                unrouted slot (sent nowhere, contributes nothing to the combine).
            topk_weights: `torch.Tensor` `[T, K]` float32, the combine weights with the routed
                scaling already applied; applied by the combine (`combine_recv`).
            layout: the layout `dispatch_recv` returns ("low_latency" or "normal").
            slot: 0 or 1, the micro-batch; at most one dispatch per slot is in flight.

        Returns:
            pending: a backend-private handle; pass it to `dispatch_recv` once.
        """
        ...

    def dispatch_recv(self, pending: Any) -> DispatchOutput:
        """Complete the dispatch: wait for its transfer on the current stream.

        Arguments:
            pending: what `dispatch_send` returned.

        Returns:
            dispatched: `LowLatencyDispatchOutput` for layout "low_latency", else
                `NormalDispatchOutput` (their fields give each tensor's shape and dtype).
        """
        ...

    def combine_send(
        self,
        expert_out: torch.Tensor,
        dispatched: DispatchOutput,
        *,
        signal: SignalContract | None = None,
    ) -> Any:
        """Issue the combine of one micro-batch and return without waiting for it.

        Arguments:
            expert_out: `torch.Tensor` in the activations dtype, the UNWEIGHTED expert output
                in the layout of `dispatched`: `[E_local, C, H]` (low latency; rows past
                masked_m[e] are not read) or `[R, H]` (normal; padding rows are not read).
            dispatched: the `dispatch_recv` output these rows answer (its `handle` routes them
                back to their tokens).
            signal: SBO only (low latency; None otherwise). The backend must not read a unit of
                `expert_out` before the unit is final: torch backends call `signal.wait(unit)`
                before reading the unit's rows; kernel backends poll `signal.signal` (`[U]`
                int32 per block or uint32 per expert) until it equals
                `signal.layout.expect_value`.

        Returns:
            pending: a backend-private handle; pass it to `combine_recv` once.
        """
        ...

    def combine_recv(self, pending: Any) -> torch.Tensor:
        """Complete the combine: wait for its transfer on the current stream.

        Arguments:
            pending: what `combine_send` returned.

        Returns:
            out: `torch.Tensor` `[T, H]` in the activations dtype, this rank's tokens in
                `dispatch_send` order: out[t] = sum over routed k, in order k = 0, 1, ..., K-1,
                of topk_weights[t, k] * (expert output of (t, k)); zeros for a token with no
                routed k.
        """
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
        """The local experts on the low-latency layout.

        Arguments:
            dispatched: hidden `[E_local, C, H]` in the activations dtype, masked_m `[E_local]`
                int32 valid rows per expert, expected_m the host-side M hint.
            signal: SBO only (None otherwise). The down GEMM marks each unit of
                `signal.layout` once the unit's output rows are final (`signal.mark(unit)`, or
                in-kernel for kernel backends, which then call `signal.marked_on_device`); the
                caller may start `combine_send` before the last unit is produced (see
                `SignalContract`). Every unit is marked exactly once, empty experts included.

        Returns:
            out: `torch.Tensor` `[E_local, C, H]` in the activations dtype: the unweighted
                SwiGLU output of every valid row; rows past masked_m[e] are unspecified.
        """
        ...

    def run_normal(self, dispatched: NormalDispatchOutput) -> torch.Tensor:
        """The local experts on the normal layout.

        Arguments:
            dispatched: hidden `[R, H]` in the activations dtype, grouped by local expert;
                row_expert `[R]` int32 (-1 = padding); num_tokens_per_expert `[E_local]` int32.

        Returns:
            out: `torch.Tensor` `[R, H]` in the activations dtype, row r the unweighted SwiGLU
                output of hidden[r] under expert row_expert[r]; padding rows are unspecified.
        """
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
