"""Hook on `sglang.srt.managers.scheduler_components.internal_state`: the gate's learned table in
GET /server_info (`internal_states[i]["sglang_overlap_gate"]`, one per DP rank), read by
`sglang-overlap gate --url`."""

from __future__ import annotations

from typing import Any

from sglang_overlap.sglang import gate
from sglang_overlap.sglang.hooks import HookSpec

GET_INTERNAL_STATE = ("sglang.srt.managers.scheduler_components.internal_state."
                      "SchedulerInternalStateController.get_internal_state")
KEY = "sglang_overlap_gate"


def add_gate_table(result: Any, *args: Any, **kwargs: Any) -> None:
    rt = gate.runtime()
    if rt is not None and isinstance(getattr(result, "internal_state", None), dict):
        result.internal_state[KEY] = rt.table()


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(GET_INTERNAL_STATE, add_gate_table, "after",
             "--overlap-gating auto: expose the learned step-time table over HTTP",
             "src:3135852beceb", feature="gate"),
)
