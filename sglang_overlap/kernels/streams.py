"""A compute stream and a communication stream joined by events; in-order no-ops on CPU.

On CUDA, `comm()` runs its body on the communication stream after the compute stream's work so
far (an event wait, not a host sync), and returns an event that `wait()` later makes the compute
stream wait on. Tensors created on one stream and used on the other are `record_stream`-ed
by the caller through `hand_over()` / `hand_back()`, so the caching allocator does not reuse
them early.
On CPU every call runs in program order and events are None.

`trace`, when a list, gets (op_name, stream_id) for every op issued through `note()`: the GPU
test uses it to check that communication and computation went to different streams.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class StreamPair:
    def __init__(self, device: torch.device | str, trace: list[tuple[str, int]] | None = None):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.compute: torch.cuda.Stream | None = (
            torch.cuda.current_stream(self.device) if self.cuda else None
        )
        self.comm_stream: torch.cuda.Stream | None = (
            torch.cuda.Stream(self.device) if self.cuda else None  # type: ignore[no-untyped-call]
        )
        self.trace = trace

    def note(self, op: str) -> None:
        """Record which stream `op` is being issued on (when tracing)."""
        if self.trace is not None:
            sid = torch.cuda.current_stream(self.device).stream_id if self.cuda else 0
            self.trace.append((op, sid))

    @contextmanager
    def comm(self, op: str) -> Iterator[list[torch.cuda.Event | None]]:
        """Run the body on the communication stream; yields a one-item list that holds, after
        the block, the event marking the end of the body (None on CPU)."""
        holder: list[torch.cuda.Event | None] = [None]
        if not self.cuda:
            self.note(op)
            yield holder
            return
        assert self.comm_stream is not None
        self.comm_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.comm_stream):
            self.note(op)
            yield holder
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self.comm_stream)
        holder[0] = event

    def wait(self, event: torch.cuda.Event | None) -> None:
        """Make the current stream wait for a `comm()` block's event (no-op on CPU)."""
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    def hand_back(self, *tensors: torch.Tensor) -> None:
        """Tensors allocated on the communication stream, now used on the current stream: keep
        the allocator from handing their memory to the next communication-stream allocation
        before the current stream is done with them (CUDA only)."""
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            for t in tensors:
                if t.is_cuda:
                    t.record_stream(current)

    def hand_over(self, *tensors: torch.Tensor) -> None:
        """Tensors used on the communication stream but allocated on another (CUDA only)."""
        if self.cuda and self.comm_stream is not None:
            for t in tensors:
                if t.is_cuda:
                    t.record_stream(self.comm_stream)
