"""A stack of MoE decode layers (`sbo_layer.DeepEPSboLayer`) run in one of the selector's three
decode modes, and decode CUDA-graph sets captured the way SGLang's `DecodeCudaGraphRunner` does
(one shared memory pool, largest batch first), one set per mode as the plugin does under
--overlap-gating auto.

Modes of `MoeStack.forward(x, mode)`, x [B, H] bf16 -> [B, H] bf16 (layer after layer,
h <- shared(h) + routed(h), fixed random routing per layer):

  none  every layer's `forward(mode="serial")`: each stage after the previous one
  sbo   every layer's `forward(mode="sbo")`: the shared expert in the dispatch window, and the
        signal down GEMM beside the overlapped combine send (the harness's SBO)
  tbo   two micro-batches (rows [0, ceil(B/2)) and the rest) through the whole stack. All DeepEP
        calls (send, then its receive hook) run on one communication stream, in the order
        dispatch A, dispatch B, combine A, combine B per layer (the order SGLang's TBO issues
        them; DeepEP's two low-latency buffers alternate call by call); the compute stream runs
        shared expert A, experts A, shared expert B, experts B, then each sum. Events order the
        two streams, so one micro-batch's dispatch/combine copies run while the other's GEMMs
        do. One rank: a DeepEP "send" is a same-GPU copy by the send kernel's SMs.

`capture_sets`: every (mode, batch size) graph into one pool from `torch.cuda.graph_pool_handle`,
batch sizes largest first and, per size, the modes in the plugin's order (tbo, sbo, none), two
eager runs before each capture (SGLang's warm-up); TBO only at sizes >= 2. Wall time in seconds,
memory in bytes.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.harness.sbo_layer import DeepEPSboLayer

MODE_ORDER = ("tbo", "sbo", "none")  # the plugin's capture order per batch size


class MoeStack:
    """`layers` sharing one DeepEP buffer; routing[l] = (topk_idx [N, K] int64, topk_w [N, K]
    fp32) for up to N tokens."""

    def __init__(self, layers: list[DeepEPSboLayer], routing: list[tuple[torch.Tensor,
                                                                       torch.Tensor]]) -> None:
        if len(layers) != len(routing) or not layers:
            raise ValueError(f"MoeStack: one routing per layer (got {len(layers)} layers, "
                             f"{len(routing)} routings)")
        self.layers, self.routing = layers, routing
        self.comm = layers[0].comm_stream  # TBO's communication stream (SBO's too)

    def forward(self, x: torch.Tensor, mode: str, first: int = 0) -> torch.Tensor:
        """x: rows [first, first + B) of the batch (they take those rows' routing)."""
        b = x.shape[0]
        if mode == "tbo":
            if b < 2 or first:
                raise ValueError(f"mode tbo splits a whole batch of at least 2 rows (got {b} "
                                 f"rows from row {first})")
            return self._tbo(x)
        if mode not in ("none", "sbo"):
            raise ValueError(f"mode must be none, tbo or sbo (got {mode!r})")
        for layer, (idx, w) in zip(self.layers, self.routing, strict=True):
            x = layer.forward(x, idx[first:first + b], w[first:first + b],
                              mode="serial" if mode == "none" else "sbo")
        return x

    def _tbo(self, x: torch.Tensor) -> torch.Tensor:
        compute, comm = torch.cuda.current_stream(), self.comm
        h = (x.shape[0] + 1) // 2
        spans = ((0, h), (h, x.shape[0]))
        xs = [x[a:b] for a, b in spans]
        eager = not torch.cuda.is_current_stream_capturing()
        comm.wait_stream(compute)
        disp = [self._dispatch(0, m, xs[m], spans[m]) for m in (0, 1)]
        for li, layer in enumerate(self.layers):
            shared, comb = [], []
            for m, (a, b) in enumerate(spans):
                d, ev = disp[m]
                shared.append(layer.shared_expert(xs[m]))
                compute.wait_event(ev)
                out = layer.down(layer.experts_up(d), d)
                comb.append(self._combine(li, m, out, d, (a, b), eager))
            for m in (0, 1):
                combined, ev = comb[m]
                compute.wait_event(ev)
                xs[m] = combined + shared[m]
                if li + 1 < len(self.layers):
                    disp[m] = self._dispatch(li + 1, m, xs[m], spans[m])
        compute.wait_stream(comm)
        return torch.cat(xs)

    def _dispatch(self, li: int, m: int, x: torch.Tensor, span: tuple[int, int]
                  ) -> tuple[Any, torch.cuda.Event]:
        """Micro-batch m's dispatch (send + receive hook) on the communication stream."""
        layer, (idx, _w) = self.layers[li], self.routing[li]
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record()
        self.comm.wait_event(ready)
        with torch.cuda.stream(self.comm):
            pending, hook = layer.dispatch_send(x, idx[span[0]:span[1]])
            hook()
            d = layer.dispatched(pending)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record()
        if not torch.cuda.is_current_stream_capturing():  # eager: keep cross-stream memory
            x.record_stream(self.comm)
            for t in (d.x, d.x_scale, d.count):
                if t is not None:
                    t.record_stream(torch.cuda.current_stream())
        return d, done

    def _combine(self, li: int, m: int, out: torch.Tensor, d: Any, span: tuple[int, int],
                 eager: bool) -> tuple[torch.Tensor, torch.cuda.Event]:
        """Micro-batch m's combine (send + receive hook) on the communication stream."""
        layer, (idx, w) = self.layers[li], self.routing[li]
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record()
        self.comm.wait_event(ready)
        with torch.cuda.stream(self.comm):
            combined, hook = layer.combine_send(out, d, idx[span[0]:span[1]],
                                                w[span[0]:span[1]])
            hook()
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record()
        if eager:
            out.record_stream(self.comm)
            combined.record_stream(torch.cuda.current_stream())
        return combined, done


@dataclass
class CaptureResult:
    """One capture of graph sets: the graphs and what they cost."""

    modes: tuple[str, ...]
    graphs: dict[tuple[str, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]]
    wall_s: float  # the capture loop, warm-up runs included (as SGLang's)
    reserved_delta: int  # torch.cuda.memory_reserved after - before (bytes)
    allocated_delta: int  # torch.cuda.memory_allocated after - before (bytes)
    pool_bytes: int | None  # segments of the shared pool (memory_snapshot), None if unknown

    def row(self) -> dict[str, Any]:
        return {"modes": list(self.modes), "graphs": len(self.graphs), "wall_s": self.wall_s,
                "reserved_delta": self.reserved_delta, "allocated_delta": self.allocated_delta,
                "pool_bytes": self.pool_bytes}


def pool_bytes(pool: Any) -> int | None:
    """Bytes of the caching allocator's segments that belong to graph pool `pool`."""
    try:
        segments = torch.cuda.memory_snapshot()
    except Exception:  # an allocator without snapshots
        return None
    if not segments or "segment_pool_id" not in segments[0]:
        return None
    return sum(s["total_size"] for s in segments if tuple(s["segment_pool_id"]) == tuple(pool))


def release() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def capture_sets(stack: MoeStack, x_static: torch.Tensor, modes: tuple[str, ...],
                 sizes: list[int], warmups: int = 2) -> CaptureResult:
    """Graphs of `modes` at every size in `sizes` (rows [:bs] of `x_static` as the static
    input) into one new shared pool; memory deltas are taken around the whole capture."""
    release()
    r0, a0 = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[tuple[str, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
    order = [m for m in MODE_ORDER if m in modes]
    t0 = time.perf_counter()
    for bs in sorted(sizes, reverse=True):
        for mode in order:
            if mode == "tbo" and bs < 2:
                continue
            x = x_static[:bs]
            for _ in range(warmups):
                stack.forward(x, mode)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                out = stack.forward(x, mode)
            graphs[mode, bs] = (g, out)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    gc.collect()
    size = pool_bytes(pool)
    return CaptureResult(tuple(order), graphs, wall, torch.cuda.memory_reserved() - r0,
                         torch.cuda.memory_allocated() - a0, size)


__all__ = ["MODE_ORDER", "CaptureResult", "MoeStack", "capture_sets", "pool_bytes", "release"]
