"""The overlapped schedule of MoE layers on two streams, per overlap mode.

A schedule is a list of tasks in the order the CPU issues them. Each task runs on one stream
("compute": the SMs' in-order CUDA stream; "comm": data in flight between GPUs), starts when its
stream is free and its dependencies have finished (or, for a streamed transfer, when a fraction of
its producer has run), exactly like kernels on CUDA streams. The stage orders follow the supported
SGLang:

- none: attention, gate, shared experts, dispatch, experts, combine - every transfer waited for.
- sbo: the shared experts run while the dispatch is in flight; the down GEMM, on fewer SMs, runs
  while the combine streams each finished unit out (the last unit leaves after the GEMM ends).
- tbo / two_chunk: two micro-batches, stages cut at upstream's yield points and issued A, B, A, B
  with B `delta` stages behind (decode 2, prefill 0), so one's transfers hide under the other's
  compute.

The steady-state layer time is the difference between simulating N+1 and N layers.
Plain Python; mypy --strict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sglang_overlap.modes import Mode
from sglang_overlap.planning.cost.stage_costs import StageCosts
from sglang_overlap.planning.interleave import interleaved_order

Stream = Literal["compute", "comm"]


@dataclass(frozen=True)
class Task:
    name: str
    stream: Stream
    micro_batch: int  # 0 = A (or the only batch), 1 = B
    layer: int
    duration_us: float
    after: tuple[int, ...] = ()  # indices of tasks that must have finished
    after_start: tuple[tuple[int, float], ...] = ()  # (task, fraction of it that must have run)


@dataclass(frozen=True)
class Segment:
    """A task as it ran: for timelines."""

    name: str
    stream: Stream
    micro_batch: int
    layer: int
    start_us: float
    end_us: float


def simulate(tasks: list[Task]) -> list[Segment]:
    free: dict[str, float] = {"compute": 0.0, "comm": 0.0}
    out: list[Segment] = []
    for task in tasks:
        ready = max((out[i].end_us for i in task.after), default=0.0)
        for i, frac in task.after_start:
            seg = out[i]
            ready = max(ready, seg.start_us + frac * (seg.end_us - seg.start_us))
        start = max(free[task.stream], ready)
        end = start + task.duration_us
        free[task.stream] = end
        out.append(Segment(task.name, task.stream, task.micro_batch, task.layer, start, end))
    return out


class _Builder:
    """Appends tasks for one micro-batch chain at a time (each task follows its chain's last)."""

    def __init__(self) -> None:
        self.tasks: list[Task] = []
        self.last: dict[int, int] = {}

    def add(self, name: str, stream: Stream, mb: int, layer: int, dur: float, *,
            after: tuple[int, ...] | None = None,
            after_start: tuple[tuple[int, float], ...] = (), chain: bool = True) -> int:
        deps = after if after is not None else (
            (self.last[mb],) if mb in self.last else ())
        self.tasks.append(Task(name, stream, mb, layer, dur, deps, after_start))
        index = len(self.tasks) - 1
        if chain:
            self.last[mb] = index
        return index


def _serial_layer(b: _Builder, c: StageCosts, layer: int) -> None:
    for name, dur in (("attn_prep", c.attn_prep), ("attn_core", c.attn_core), ("gate", c.gate),
                      ("shared", c.shared), ("dispatch_send", c.dispatch_send)):
        b.add(name, "compute", 0, layer, dur)
    b.add("dispatch", "comm", 0, layer, c.dispatch_xfer)
    for name, dur in (("dispatch_recv", c.dispatch_recv), ("gate_up", c.gate_up), ("act", c.act),
                      ("down", c.down), ("combine_send", c.combine_send)):
        b.add(name, "compute", 0, layer, dur)
    b.add("combine", "comm", 0, layer, c.combine_xfer)
    b.add("combine_recv", "compute", 0, layer, c.combine_recv)
    b.add("output", "compute", 0, layer, c.output)


def _sbo_layer(b: _Builder, c: StageCosts, layer: int) -> None:
    for name, dur in (("attn_prep", c.attn_prep), ("attn_core", c.attn_core), ("gate", c.gate),
                      ("dispatch_send", c.dispatch_send)):
        b.add(name, "compute", 0, layer, dur)
    send = b.last[0]
    xfer = b.add("dispatch", "comm", 0, layer, c.dispatch_xfer, after=(send,), chain=False)
    b.add("shared", "compute", 0, layer, c.shared)
    b.add("dispatch_recv", "compute", 0, layer, c.dispatch_recv, after=(b.last[0], xfer))
    b.add("gate_up", "compute", 0, layer, c.gate_up)
    b.add("act", "compute", 0, layer, c.act)
    down = b.add("down", "compute", 0, layer, c.down_sbo)
    # The combine sends each unit once the GEMM has signalled it: all but the last unit stream
    # out while the GEMM runs; the last leaves after the GEMM ends.
    units = max(1, c.sbo_units)
    body = c.combine_xfer * (units - 1) / units
    first = b.add("combine", "comm", 0, layer, body, after=(),
                  after_start=((down, 1.0 / units),), chain=False)
    tail = b.add("combine", "comm", 0, layer, c.combine_xfer - body, after=(down, first),
                 chain=False)
    b.add("combine_recv", "compute", 0, layer, c.combine_recv, after=(down, tail))
    b.add("output", "compute", 0, layer, c.output)


Stage = list[tuple[str, Stream, float]]


def _decode_stages(c: StageCosts) -> list[Stage]:
    """_compute_moe_deepseek_blog_decode: 5 yields per layer; the tail (output) has no yield
    after it, so it runs in one stage with the next layer's first."""
    return [
        [("attn_prep", "compute", c.attn_prep)],
        [("attn_core", "compute", c.attn_core), ("gate", "compute", c.gate)],
        [("dispatch_send", "compute", c.dispatch_send), ("dispatch", "comm", c.dispatch_xfer),
         ("shared", "compute", c.shared)],
        [("dispatch_recv", "compute", c.dispatch_recv), ("gate_up", "compute", c.gate_up),
         ("act", "compute", c.act), ("down", "compute", c.down),
         ("combine_send", "compute", c.combine_send), ("combine", "comm", c.combine_xfer)],
        [("combine_recv", "compute", c.combine_recv)],
        [("output", "compute", c.output)],
    ]


def _prefill_stages(c: StageCosts) -> list[Stage]:
    """_compute_moe_deepseek_blog_prefill: 2 yields per layer; the tail (shared experts, combine
    receive, output) shares a stage with the next layer's attention and dispatch."""
    return [
        [("attn_prep", "compute", c.attn_prep), ("attn_core", "compute", c.attn_core),
         ("gate", "compute", c.gate), ("dispatch_send", "compute", c.dispatch_send),
         ("dispatch", "comm", c.dispatch_xfer)],
        [("dispatch_recv", "compute", c.dispatch_recv), ("gate_up", "compute", c.gate_up),
         ("act", "compute", c.act), ("down", "compute", c.down),
         ("combine_send", "compute", c.combine_send), ("combine", "comm", c.combine_xfer)],
        [("shared", "compute", c.shared), ("combine_recv", "compute", c.combine_recv),
         ("output", "compute", c.output)],
    ]


def _two_batch_tasks(costs: tuple[StageCosts, StageCosts], layers: int, decode: bool) -> list[Task]:
    stage_fn = _decode_stages if decode else _prefill_stages
    delta = 2 if decode else 0
    per_mb: list[list[tuple[int, Stage]]] = []
    for c in costs:
        stages: list[tuple[int, Stage]] = []
        tail: Stage = []
        for layer in range(layers):
            layer_stages = stage_fn(c)
            stages.append((layer, [*tail, *layer_stages[0]]))
            stages.extend((layer, s) for s in layer_stages[1:-1])
            tail = layer_stages[-1]
        stages.append((layers - 1, tail))
        per_mb.append(stages)
    b = _Builder()
    in_flight: dict[int, int] = {}  # micro-batch -> its transfer the next receive waits for
    for mb, index in interleaved_order(len(per_mb[0]), delta):
        layer, stage = per_mb[mb][index]
        for name, stream, dur in stage:
            if stream == "comm":
                in_flight[mb] = b.add(name, stream, mb, layer, dur, chain=False)
                exposed = costs[mb].a2a_exposed * dur
                if exposed > 0:  # the part of the transfer the other micro-batch cannot hide
                    b.add(f"{name}_wait", "compute", mb, layer, exposed,
                          after_start=((in_flight[mb], 0.0),))
            elif name.endswith("_recv"):
                b.add(name, stream, mb, layer, dur, after=(b.last[mb], in_flight.pop(mb)))
            else:
                b.add(name, stream, mb, layer, dur)
    return b.tasks


def build_tasks(mode: str, costs: tuple[StageCosts, ...], layers: int, decode: bool) -> list[Task]:
    """The issue-ordered tasks of `layers` MoE layers under `mode`."""
    if mode in (Mode.TBO, Mode.TWO_CHUNK):
        if len(costs) != 2:
            raise ValueError(f"{mode} needs two micro-batches' costs (got {len(costs)})")
        return _two_batch_tasks((costs[0], costs[1]), layers, decode)
    b = _Builder()
    for layer in range(layers):
        if mode == Mode.SBO:
            _sbo_layer(b, costs[0], layer)
        elif mode == Mode.NONE:
            _serial_layer(b, costs[0], layer)
        else:
            raise ValueError(f"unknown overlap mode {mode!r}; expected none, sbo, tbo, two_chunk")
    return b.tasks


def makespan(segments: list[Segment]) -> float:
    return max((s.end_us for s in segments), default=0.0)


def steady_layer(mode: str, costs: tuple[StageCosts, ...], decode: bool,
                 warm_layers: int = 3) -> tuple[float, list[Segment]]:
    """(steady-state time of one layer, the segments of one mid-stream layer's window)."""
    short = makespan(simulate(build_tasks(mode, costs, warm_layers, decode)))
    segments = simulate(build_tasks(mode, costs, warm_layers + 1, decode))
    period = makespan(segments) - short
    layer = warm_layers - 1
    start = min(s.start_us for s in segments if s.layer == layer and s.micro_batch == 0)
    window = [
        Segment(s.name, s.stream, s.micro_batch, s.layer, max(s.start_us, start) - start,
                min(s.end_us, start + period) - start)
        for s in segments
        if s.end_us > start and s.start_us < start + period and s.end_us > s.start_us
    ]
    return period, window
