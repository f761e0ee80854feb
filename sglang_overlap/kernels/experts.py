"""The torch expert runner the server runs where no kernel library computes the experts
(`--moe-a2a-backend torch_a2a`): `contracts.ExpertRunner` on both DeepEP layouts.

It computes valid rows only, with the library matmuls (SGLang's other layers use them too): it
reads the per-expert counts on the host, free on CPU, one sync on GPU (where DeepEP and DeepGEMM
are the fast path). The pure-torch oracle it is checked against (kept with the tests, outside the
package) is a separate, batch-independent implementation on purpose: a reference that shared this
code could not catch its bugs.

Legend: E local experts, C capacity rows per expert, R rows of the normal layout, H hidden,
I moe intermediate.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from sglang_overlap.kernels.contracts import (
    LowLatencyDispatchOutput,
    NormalDispatchOutput,
    SignalContract,
)


class TorchExperts:
    """Local experts w13 `[E, 2I, H]` (gate rows first, SGLang's layout) and w2 `[E, H, I]`."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        if w13.shape[0] != w2.shape[0] or w13.shape[1] != 2 * w2.shape[2]:
            raise ValueError(f"expert weights: want w13 [E, 2I, H] and w2 [E, H, I]; got "
                             f"w13={tuple(w13.shape)} w2={tuple(w2.shape)}")
        self.w13, self.w2 = w13, w2

    def _mlp(self, x: torch.Tensor, e: int) -> torch.Tensor:  # [M, H] -> [M, H]
        gate, up = F.linear(x, self.w13[e]).chunk(2, dim=-1)  # [M, I] each
        return F.linear(F.silu(gate) * up, self.w2[e])

    def run_low_latency(self, d: LowLatencyDispatchOutput, *,
                        signal: SignalContract | None = None) -> torch.Tensor:
        counts = d.masked_m.tolist()  # the host sync (see the module docstring)
        out = torch.zeros_like(d.hidden)  # [E, C, H]; rows past masked_m stay 0
        units = self._produce(d.hidden, out, counts, signal)
        if signal is None:
            for _ in units:
                pass
        else:
            signal.attach_producer(units)
        return out

    def _produce(self, hidden: torch.Tensor, out: torch.Tensor, counts: list[int],
                 signal: SignalContract | None) -> Iterator[None]:
        """One expert at a time; with SBO, marks that expert's units once its rows are final."""
        for e, m in enumerate(counts):
            if m:
                out[e, :m] = self._mlp(hidden[e, :m], e)
            if signal is not None:
                for unit in signal.units_of_expert(e):
                    signal.mark(unit)
            yield

    def run_normal(self, d: NormalDispatchOutput) -> torch.Tensor:
        out = torch.zeros_like(d.hidden)  # [R, H]: rows grouped by expert, padding rows last
        start = 0
        for e, m in enumerate(d.num_tokens_per_expert.tolist()):
            if m:
                out[start : start + m] = self._mlp(d.hidden[start : start + m], e)
            start += m
        return out
