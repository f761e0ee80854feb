"""The SBO signal contract: the down GEMM marks units finished; combine-send takes marked units.

A unit is one (expert, block) tile row range (granularity "block") or one whole local expert
(granularity "expert") of the low-latency expert output [E_local, C, H], laid out by
`planning.sbo_layout.SboLayout`:
    block:  unit = expert * blocks_per_expert + block, rows [block*block_m, (block+1)*block_m)
    expert: unit = expert, rows [0, C)
`signal` is the device counter array the kernels use ([E_local*blocks_per_expert] int32 or
[E_local] uint32); a unit is final when its counter equals `layout.expect_value`.

Producer side (expert runner): after a unit's down-GEMM output is written, `mark(unit)` bumps
its counter by what the unit's tiles add (kernel backends do this in the GEMM epilogue).
A torch runner may return before producing every unit: it hands `attach_producer` a generator
that produces (and marks) units one at a time, so combine-send can interleave with it.

Consumer side (combine-send): `wait(unit)` before reading the unit's rows. It advances the
attached producer until `mark(unit)` has been issued, then
    CPU:  checks the counter equals expect_value (torch._assert_async: no Python-level sync);
    CUDA: makes the current (communication) stream wait for the event recorded by `mark`.
`finish()` runs the producer to the end (units nobody waited for, e.g. empty experts).

Kernel producers (a GEMM that bumps the counters itself) call `marked_on_device()` instead of
`mark()`; consumers then poll `signal` in a kernel (DeepEP's `low_latency_combine(overlap=True,
src_signals=signal, src_signal_expect_value=expect_value)`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from sglang_overlap.planning.sbo_layout import SboLayout

_DTYPES = {"int32": torch.int32, "uint32": torch.uint32}


class SignalError(RuntimeError):
    """The signal contract was broken (a unit read before it was marked, or marked twice)."""


class SignalContract:
    """One SBO step's signal array plus the host-side order of marks. Not reusable."""

    def __init__(self, layout: SboLayout, device: torch.device | str) -> None:
        self.layout = layout
        self.device = torch.device(device)
        # Counters are kept in int32 for the torch path's arithmetic (uint32 has few CPU ops);
        # `signal` exposes the layout's dtype view for kernel backends.
        self._counters = torch.zeros(layout.signal_shape, dtype=torch.int32, device=self.device)
        self._marked: set[int] = set()
        self._events: dict[int, torch.cuda.Event] = {}
        self._producer: Iterator[None] | None = None
        self._producer_stream: torch.cuda.Stream | None = None
        self._device_marks = False
        self._done_event: torch.cuda.Event | None = None

    @property
    def num_units(self) -> int:
        return int(self.layout.signal_shape[0])

    @property
    def signal(self) -> torch.Tensor:
        """The counters as the kernels see them: `torch.Tensor` of `layout.signal_shape` on
        `device`, `[E_local * blocks_per_expert]` int32 (granularity "block") or `[E_local]`
        uint32 ("expert"); unit u is final when signal[u] == `layout.expect_value`. A view of
        the int32 counters `mark` bumps, so host marks and kernel bumps meet in one buffer."""
        return self._counters.view(_DTYPES[self.layout.signal_dtype])

    def unit_rows(self, unit: int) -> tuple[int, int, int]:
        """(expert, row_start, row_end) of a unit in the [E_local, C, H] output."""
        lay = self.layout
        if lay.granularity == "expert":
            return unit, 0, lay.capacity
        expert, block = divmod(unit, lay.blocks_per_expert)
        start = block * lay.block_m
        return expert, start, min(start + lay.block_m, lay.capacity)

    def units_of_expert(self, expert: int) -> range:
        if self.layout.granularity == "expert":
            return range(expert, expert + 1)
        per = self.layout.blocks_per_expert
        return range(expert * per, (expert + 1) * per)

    # producer side -------------------------------------------------------------------------
    def mark(self, unit: int) -> None:
        """The unit's output rows are final (issued on the current stream)."""
        if unit in self._marked:
            raise SignalError(f"SBO unit {unit} marked twice (num_units={self.num_units})")
        # Every tile of the unit's grid bumps its counter once, so one unit adds expect_value.
        self._counters[unit] += self.layout.expect_value
        self._marked.add(unit)
        if self.device.type == "cuda":
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(torch.cuda.current_stream(self.device))
            self._events[unit] = event

    def attach_producer(self, producer: Iterator[None]) -> None:
        """A generator that produces and marks units, one per `next()`. On CUDA it is always
        advanced on the stream current now (the compute stream), whoever waits."""
        self._producer = producer
        if self.device.type == "cuda":
            self._producer_stream = torch.cuda.current_stream(self.device)

    def _advance(self) -> bool:
        if self._producer is None:
            return False
        if self._producer_stream is not None:
            with torch.cuda.stream(self._producer_stream):
                done = next(self._producer, _DONE) is _DONE
        else:
            done = next(self._producer, _DONE) is _DONE
        if done:
            self._producer = None
        return not done

    def marked_on_device(self, done: torch.cuda.Event | None = None) -> None:
        """For kernel producers (a signal-emitting GEMM bumps `signal` itself): no host marks.

        Kernel consumers poll `signal` and need nothing else. A torch consumer then waits for
        `done` (an event recorded after the whole GEMM): correct, without the overlap.
        """
        self._device_marks = True
        self._done_event = done

    # consumer side -------------------------------------------------------------------------
    def wait(self, unit: int) -> None:
        """Block the consumer (the current stream on CUDA) until `unit` is final."""
        if self._device_marks:
            if self._done_event is None:
                raise SignalError(
                    f"SBO unit {unit}: units are marked by a kernel and no completion event was "
                    "given; consume them with a kernel that polls `signal`")
            torch.cuda.current_stream(self.device).wait_event(self._done_event)
            return
        while unit not in self._marked:
            if not self._advance():
                raise SignalError(
                    f"SBO unit {unit} read before it was marked and the producer is finished "
                    f"(marked {len(self._marked)} of {self.num_units} units)"
                )
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).wait_event(self._events[unit])
        else:
            torch._assert_async(
                self._counters[unit] == self.layout.expect_value,
                f"SBO unit {unit} counter differs from expect_value={self.layout.expect_value}",
            )

    def finish(self) -> None:
        """Run the producer to its end; afterwards every unit must be marked (unless the
        units are marked on the device, where the host cannot see them)."""
        if self._device_marks:
            return
        while self._advance():
            pass
        if len(self._marked) != self.num_units:
            missing = sorted(set(range(self.num_units)) - self._marked)[:8]
            raise SignalError(f"SBO producer finished without marking units {missing}...")


_DONE = object()


def new_signal(layout: SboLayout, device: torch.device | str) -> torch.Tensor:
    """The signal buffer a kernel producer raises, zeroed.

    Arguments:
        layout: the SBO layout the producer's tiles count (`down_gemm.signal_layout`).
        device: where the GEMM runs.

    Returns:
        signal: `torch.Tensor` zeros of `layout.signal_shape`: `[E_local * blocks_per_expert]`
            int32 (granularity "block") or `[E_local]` uint32 ("expert").
    """
    dtype = torch.uint32 if layout.signal_dtype == "uint32" else torch.int32
    return torch.zeros(layout.signal_shape, dtype=dtype, device=device)
