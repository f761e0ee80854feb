"""CUDA streams and events on the CPU, for SGLang's stream code in the deepep servers
(SGLANG_CPU_SHIM_DEEPEP=1 while no CUDA device is usable).

SGLang's GPU path runs work on a side stream and orders it with events: the MoE layer's shared
expert on `DeepseekV2MoE.alt_stream`, SBO's combine send on `CombineOverlapArgs.stream` after
`wait_event(start_event)`, the down GEMM recording `DownGemmOverlapArgs.start_event`. SGLang
creates the side stream only on CUDA (`DeepseekV2Model.__init__`), builds the events with
`torch.cuda.Event()` and enters streams with `torch.cuda.stream(s)`, so on a CPU the SBO code
cannot run at all. Here:

- `Stream`: a stream of a device that executes every operation when the host issues it (the
  CPU). `wait_stream`, `wait_event`, `record_event`, `synchronize` have nothing to wait for;
  they are counted, so a test sees what SGLang's stream code did.
- `Event`: `torch.cuda.Event`'s interface (`record`, `wait`, `query`, `synchronize`,
  `elapsed_time` in milliseconds when built with enable_timing=True, from the host clock).
- `torch.cuda.current_stream()` is the stream entered last with `torch.cuda.stream(s)` (the
  process's main `Stream` outside any), `torch.cuda.Event` is `Event`, and
  `Tensor.record_stream(s)` accepts a `Stream` (nothing to keep alive: the CPU allocator frees
  at the host's last reference, after every use already ran).
- `DeepseekV2MoE.alt_stream` is one side `Stream` per process where SGLang left it None, as
  `DeepseekV2Model` shares its one CUDA side stream among the layers.

Counters, in `deep_ep_gloo.COUNTERS` (written with the graph counters): `side_stream_enters`
(a `torch.cuda.stream(s)` entered on a side stream), `events_recorded`, `event_waits`
(`wait_event` calls), `stream_waits` (`wait_stream` calls).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

MOE_INIT = "sglang.srt.models.deepseek_v2.DeepseekV2MoE.__init__"


def _count(key: str) -> None:
    from sglang_cpu_shim.deep_ep_gloo import COUNTERS

    COUNTERS[key] += 1


class Event:
    """`torch.cuda.Event` on a device that completes work as the host issues it."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, external: bool = False) -> None:
        self.enable_timing = enable_timing
        self._at: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        self._at = time.perf_counter()
        _count("events_recorded")

    def wait(self, stream: Stream | None = None) -> None:
        _count("event_waits")

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event's record to `end`'s (both need enable_timing=True)."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if self._at is None or end._at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        return (end._at - self._at) * 1e3


class Stream:
    """A stream of a device that executes every operation when the host issues it."""

    def __init__(self, device: Any = None, priority: int = 0, *, side: bool = True) -> None:
        self.device = torch.device("cpu")
        self.priority, self.side = priority, side

    def wait_stream(self, stream: Any) -> None:
        _count("stream_waits")

    def wait_event(self, event: Any) -> None:
        _count("event_waits")

    def record_event(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


MAIN = Stream(side=False)
_current: list[Stream] = [MAIN]
SIDE = Stream()
"""The side stream of every MoE layer of this process (SGLang's `alt_stream`)."""


def current_stream(device: Any = None) -> Stream:
    return _current[-1]


@contextlib.contextmanager
def stream(s: Stream | None) -> Iterator[None]:
    """`torch.cuda.stream(s)`: make `s` the current stream inside (None: leave it)."""
    if s is None:
        yield
        return
    if not isinstance(s, Stream):
        raise TypeError(f"cpu_shim streams: {type(s).__name__} is not a cpu_shim Stream")
    if s.side:
        _count("side_stream_enters")
    _current.append(s)
    try:
        yield
    finally:
        _current.pop()


def moe_init(orig: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    orig(self, *args, **kwargs)
    if getattr(self, "alt_stream", None) is None:
        self.alt_stream = SIDE


def install() -> None:
    """Replace torch.cuda's stream and event entry points (only while CUDA is unusable) and give
    every `DeepseekV2MoE` the side stream."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if torch.cuda.is_available():
        return
    torch.cuda.Event = Event  # type: ignore[misc,assignment]
    torch.cuda.current_stream = current_stream  # type: ignore[assignment]
    torch.cuda.stream = stream  # type: ignore[assignment]
    record_stream = torch.Tensor.record_stream

    def record_stream_on(tensor: torch.Tensor, s: Any) -> None:
        if not isinstance(s, Stream):
            record_stream(tensor, s)

    torch.Tensor.record_stream = record_stream_on  # type: ignore[method-assign]
    HookRegistry.register(MOE_INIT, moe_init, HookType.AROUND)
