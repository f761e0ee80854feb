"""The TBO step marker around upstream's executor, and upstream's stage order = the planning
layer's `interleaved_order` (which the reference executor and the cost model's schedule use).

Upstream's `_StageExecutor` needs a full ForwardBatch with DP buffers; the order test runs
upstream's real `execute_overlapped_operations` loop with executors that only record their turn.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import require_module

ops = require_module("sglang.srt.batch_overlap.operations")

from sglang_overlap.planning.interleave import interleaved_order  # noqa: E402
from sglang_overlap.settings import OverlapSettings  # noqa: E402
from sglang_overlap.sglang import state  # noqa: E402
from sglang_overlap.sglang.upstream import operations  # noqa: E402


class _Recorder:
    turns: list[tuple[int, int]] = []

    def __init__(self, name: str, stages: list[Any], inputs: Any, child_ctx: Any) -> None:
        self.mb, self.num_stages, self.index = "ab".index(name), len(stages), 0
        self.output = name

    @property
    def done(self) -> bool:
        return self.index == self.num_stages

    def next(self) -> None:
        assert not self.done
        _Recorder.turns.append((self.mb, self.index))
        self.index += 1


@pytest.mark.parametrize(("num_stages", "delta"), [(1, 0), (5, 0), (6, 2), (3, 3), (9, 1)])
def test_upstream_order_is_interleaved_order(monkeypatch: pytest.MonkeyPatch, num_stages: int,
                                             delta: int) -> None:
    monkeypatch.setattr(ops, "_StageExecutor", _Recorder)
    monkeypatch.setattr(ops, "_resolve_tbo_child_contexts", lambda: (None, None))
    stages = [[ops.ExecutionOperation(f"s{i}", lambda state, **kw: None)] for i in range(
        num_stages)]
    monkeypatch.setattr(ops, "_convert_operations_to_stages", lambda operations: stages)
    _Recorder.turns = []
    upstream = ops.execute_overlapped_operations.__wrapped__ if hasattr(
        ops.execute_overlapped_operations, "__wrapped__") else ops.execute_overlapped_operations
    assert upstream([{}, {}], [[], []], [0, delta]) == ["a", "b"]
    assert tuple(_Recorder.turns) == interleaved_order(num_stages, delta), f"{num_stages=} {delta=}"


def test_the_marker_is_on_only_while_upstream_runs() -> None:
    seen = []

    def upstream(inputs: Any, operations_arr: Any, delta: Any) -> list[str]:
        seen.append((state.in_tbo(), state.sbo_active()))
        return ["a", "b"]

    state.configure(OverlapSettings(enable_single_batch_overlap=True))
    try:
        assert not state.in_tbo() and state.sbo_active()
        assert operations.execute_overlapped_operations(upstream, [1, 2], [3, 4], [0, 2]) == [
            "a", "b"]
        assert seen == [(True, False)]  # SBO does not apply inside TBO, as upstream
        assert not state.in_tbo() and state.sbo_active()
        with pytest.raises(ZeroDivisionError):
            operations.execute_overlapped_operations(lambda *a: 1 / 0, [], [], [0, 0])
        assert not state.in_tbo()
    finally:
        state.configure(None)
