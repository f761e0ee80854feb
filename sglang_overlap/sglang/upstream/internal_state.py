"""Hook on `sglang.srt.managers.scheduler_components.internal_state`: the mode selector's learned
table and this process's step counters in GET /server_info
(`internal_states[i]["sglang_overlap_gate"]`, one per DP rank), read by `sglang-overlap gate
--url` and the end-to-end tests."""

from __future__ import annotations

from typing import Any

from sglang_overlap import stats
from sglang_overlap.modes import Feature
from sglang_overlap.sglang import selector_setup
from sglang_overlap.sglang.hooks import HookSpec
from sglang_overlap.sglang.selector_runtime import SelectorRuntime

GET_INTERNAL_STATE = ("sglang.srt.managers.scheduler_components.internal_state."
                      "SchedulerInternalStateController.get_internal_state")
KEY = "sglang_overlap_gate"


def served_table(rt: SelectorRuntime) -> dict[str, Any]:
    """The learned table (JSON-ready), with this process's labelled step counters
    (`stats.snapshot`: steps by phase/mode/runner, eager fallbacks, decisions)."""
    sel = rt.selector
    counters = {name: [[*labels, n] for labels, n in sorted(series.items())]
                for name, series in stats.snapshot().items()}
    return {
        "setup": rt.setup, "prior": sel.prior.name, "steps": sel.steps,
        "explored": sel.explored, "syncs": rt.syncs,
        "chosen": {f"{phase}/{mode}": n for (phase, mode), n in sorted(sel.chosen.items())},
        "rows": [{"phase": r.phase, "tokens": [r.tokens_lo, r.tokens_hi], "mode": r.mode,
                  "count": r.count, "mean_ms": round(r.mean_us / 1e3, 4)}
                 for r in sel.table.rows()],
        "counters": counters,
    }


def add_gate_table(result: Any, *args: Any, **kwargs: Any) -> None:
    rt = selector_setup.runtime()
    if rt is not None and isinstance(getattr(result, "internal_state", None), dict):
        result.internal_state[KEY] = served_table(rt)


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(GET_INTERNAL_STATE, add_gate_table, "after",
             "--overlap-gating auto: expose the learned step-time table over HTTP",
             "src:be92c976c9e2", feature=Feature.GATE),
)
