"""Bounded waits on an SBO step: a combine send that never finishes becomes a `SignalError`.

Neither DeepEP tree bounds the send's wait on the signal (`combine_overlap.py`): a producer that
never runs, or a counter that overshoots, spins the send forever. A host that waits for the step
(tests, benchmarks, serving with `SGLANG_OVERLAP_SBO_WATCHDOG_S` set) polls an event recorded
after the send, with a deadline. On timeout it reads the counters through a copy engine (a
device-to-host copy on a private stream needs no SM, so it completes while every SM spins),
names each unit the send still waits for, and with `release=True` writes the final values from
the host (host-to-device, no SM either) so the send drains and the process stays usable; the
step's output is then wrong, and the error says so.

`SignalWatchdog` does the same from a thread, armed before the launches it guards. What no
host code can break (seen on the H200, `benchmarks/results/h200_sbo_layer.md`): a producer kernel
launched for the first time after the send spins. CUDA's lazy loading then waits for the device
to go idle inside that launch, and the release copy blocks in the driver too; only killing the
process ends it. `sbo_layer.py`'s launch order rules that case out.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import torch

from sglang_overlap.kernels.signals import SignalError

if TYPE_CHECKING:
    from sglang_overlap.planning.sbo_layout import SboLayout

WATCHDOG_ENV = "SGLANG_OVERLAP_SBO_WATCHDOG_S"


def wait_event(event: torch.cuda.Event, timeout_s: float, poll_s: float = 2e-4) -> bool:
    """True once `event` has completed, False after `timeout_s` (never blocks in CUDA)."""
    deadline = time.monotonic() + timeout_s
    while not event.query():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]


def snapshot(t: torch.Tensor, timeout_s: float = 2.0) -> list[int] | None:
    """`t`'s values read by a copy engine on a private stream, or None if even that stalls."""
    host = torch.empty(t.shape, dtype=t.dtype if t.dtype != torch.uint32 else torch.int32,
                       pin_memory=True)
    stream = _copy_stream(t.device)
    with torch.cuda.stream(stream):
        src = t.view(torch.int32) if t.dtype == torch.uint32 else t
        host.copy_(src, non_blocking=True)
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record(stream)
    if not wait_event(done, timeout_s):
        return None
    values = host.tolist()
    return [v & 0xFFFFFFFF for v in values] if t.dtype == torch.uint32 else values


def release(signal: torch.Tensor, layout: SboLayout, timeout_s: float = 2.0) -> bool:
    """Write every counter's final value from the host (no SM needed); True once written."""
    dtype = torch.int32  # uint32 counters are written through an int32 view
    host = torch.full(layout.signal_shape, layout.expect_value, dtype=dtype, pin_memory=True)
    stream = _copy_stream(signal.device)
    with torch.cuda.stream(stream):
        signal.view(dtype).copy_(host, non_blocking=True)
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record(stream)
    return wait_event(done, timeout_s)


def waited_units(layout: SboLayout, counts: list[int] | None) -> list[tuple[int, int, int]]:
    """(signal index, expert, block) the combine send waits on: every expert (per expert), or
    blocks below ceil(count / block_m) of non-empty experts (per block, as antgroup-opt)."""
    if layout.granularity == "expert":
        return [(e, e, 0) for e in range(layout.num_local_experts)]
    out = []
    for e in range(layout.num_local_experts):
        n = layout.blocks_per_expert if counts is None else -(-counts[e] // layout.block_m)
        out += [(layout.signal_index(e, b), e, b) for b in range(n)]
    return out


def diagnose(layout: SboLayout, counters: list[int] | None, counts: list[int] | None) -> str:
    """One line naming the units whose counters differ from the final value."""
    if counters is None:
        return "the counters could not be read (even a copy-engine read stalled)"
    stuck = [(i, e, b, counters[i]) for i, e, b in waited_units(layout, counts)
             if counters[i] != layout.expect_value]
    if not stuck:
        return "every waited unit is final: the send itself has not run (no SM for it?)"
    rows = ", ".join(f"expert {e} block {b} (signal[{i}]={v})" for i, e, b, v in stuck[:8])
    more = f" and {len(stuck) - 8} more" if len(stuck) > 8 else ""
    return (f"{len(stuck)} unit(s) below their final value {layout.expect_value}: {rows}{more}"
            " - their producer has not run or wrote another value")


def wait_or_raise(done: torch.cuda.Event, *, signal: torch.Tensor, layout: SboLayout,
                  recv_count: torch.Tensor | None = None, timeout_s: float,
                  release_on_timeout: bool = True, what: str = "SBO combine send") -> None:
    """Wait for `done` (recorded after the combine send) at most `timeout_s`; then raise
    SignalError naming the stuck units, after releasing them when `release_on_timeout`."""
    if wait_event(done, timeout_s):
        return
    counters = snapshot(signal)
    counts = snapshot(recv_count) if recv_count is not None else None
    text = diagnose(layout, counters, counts)
    released = release_on_timeout and release(signal, layout) and wait_event(done, 5.0)
    tail = ("; released from the host so the device drains (this step's output is wrong)"
            if released else "; the device is still spinning: restart the process")
    raise SignalError(f"{what} still waiting after {timeout_s:.1f} s: {text}{tail}")


class SignalWatchdog:
    """`wait_or_raise` on a thread, armed before the launches it guards:

        with SignalWatchdog(timeout_s, signal=sig, layout=lay) as dog:
            ... launch producer and send; dog.arm(event_after_send) ...
        # raises SignalError on exit if it fired
    """

    def __init__(self, timeout_s: float, *, signal: torch.Tensor, layout: SboLayout,
                 recv_count: torch.Tensor | None = None) -> None:
        self.timeout_s, self.signal, self.layout, self.recv_count = (
            timeout_s, signal, layout, recv_count)
        self._event: torch.cuda.Event | None = None
        self._armed = threading.Event()
        self.error: SignalError | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def arm(self, event: torch.cuda.Event) -> None:
        self._event = event
        self._armed.set()

    def _run(self) -> None:
        if not self._armed.wait(self.timeout_s):
            self.error = SignalError(f"SBO step not launched within {self.timeout_s:.1f} s "
                                     "(the host is blocked in a CUDA call)")
            release(self.signal, self.layout)
            return
        if self._event is None:  # left the block without arming: nothing to watch
            return
        try:
            wait_or_raise(self._event, signal=self.signal, layout=self.layout,
                          recv_count=self.recv_count, timeout_s=self.timeout_s)
        except SignalError as exc:
            self.error = exc

    def __enter__(self) -> SignalWatchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._armed.set()
        self._thread.join(self.timeout_s + 15.0)
        if self.error is not None and exc[0] is None:
            raise self.error


__all__ = ["WATCHDOG_ENV", "SignalWatchdog", "diagnose", "release", "snapshot", "wait_event",
           "wait_or_raise", "waited_units"]
