"""kernels/streams.py on CPU: program order, no events, tracing of where each op was issued,
and hand-over / hand-back leave CPU tensors alone (their CUDA side runs in tests/gpu)."""

from __future__ import annotations

import torch

from sglang_overlap.kernels.streams import StreamPair


def test_cpu_runs_in_program_order_without_events() -> None:
    trace: list[tuple[str, int]] = []
    pair = StreamPair("cpu", trace=trace)
    assert not pair.cuda and pair.compute is None and pair.comm_stream is None
    order = []
    with pair.comm("send") as done:
        order.append("body")
    order.append("after")
    assert done == [None] and order == ["body", "after"]
    pair.wait(done[0])  # a None event is a no-op
    pair.note("compute_op")
    assert trace == [("send", 0), ("compute_op", 0)]


def test_untraced_pair_records_nothing_and_keeps_tensors() -> None:
    pair = StreamPair(torch.device("cpu"))
    x = torch.arange(4)
    pair.note("op")
    pair.hand_over(x)
    pair.hand_back(x)
    assert pair.trace is None and x.tolist() == [0, 1, 2, 3]


def test_the_body_may_raise_and_the_pair_stays_usable() -> None:
    pair = StreamPair("cpu", trace=[])
    try:
        with pair.comm("boom"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    with pair.comm("next") as done:
        pass
    assert done == [None] and pair.trace == [("boom", 0), ("next", 0)]
