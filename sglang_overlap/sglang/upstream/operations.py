"""Hook on `sglang.srt.batch_overlap.operations`: mark the TBO step while upstream runs it.

Upstream's `execute_overlapped_operations` runs the two children's stages in the order of
`planning.interleave.interleaved_order` (the order checked against upstream's source), so the plugin
keeps upstream's executor and only wraps it: while it runs,
`state.in_tbo()` is true (SBO does not apply inside TBO, as upstream), and the step is counted.
"""

from __future__ import annotations

from typing import Any

from sglang_overlap import stats
from sglang_overlap.modes import Feature
from sglang_overlap.sglang import state
from sglang_overlap.sglang.hooks import HookSpec

EXECUTE_OVERLAPPED = "sglang.srt.batch_overlap.operations.execute_overlapped_operations"


def execute_overlapped_operations(orig: Any, inputs_arr: Any, operations_arr: Any,
                                  delta_stages: Any) -> Any:
    with state.tbo_running():
        outputs = orig(inputs_arr, operations_arr, delta_stages)
    stats.count("tbo_executor")
    return outputs


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(EXECUTE_OVERLAPPED, execute_overlapped_operations, "around",
             "mark the TBO step (no SBO inside it) around upstream's interleaved executor",
             "src:e7cadc78490e", feature=Feature.TBO),
)
