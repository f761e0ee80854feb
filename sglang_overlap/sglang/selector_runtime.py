"""The mode selector's measurements (--overlap-gating auto): this rank's step times, and how
they reach every rank so that all ranks merge the same cells at the same step.

The forward hook (`model_runner.py`) times each decided step into this rank's `local` table:
wall time on CPU; on GPU two CUDA events, read only once completed (no device sync on the hot
path). How measurements travel (`Transport`) depends on the layout; neither adds a collective of
its own per step:

* `broadcast` (no attention DP: TP ranks run the same batch): only the TP leader times. After
  --overlap-gating-sync-steps calls it attaches its new cells (`SelectorShare`) to the next
  request list SGLang broadcasts to the TP group that carries requests, or to an empty one after
  `RIDE_WAIT` times as many (`request_receiver.py`); every rank merges the share it receives.
* `all_reduce` (attention DP: each rank runs its own batch): every --overlap-gating-sync-steps
  calls, `tick` sums the ranks' new cells with one all-reduce over the TP CPU group: three
  integers per cell ever decided (count, total, squares; the same cells, same order, on every
  rank).

The learned table is logged every `TABLE_LOG_STEPS` steps and at exit (`log_table`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from sglang_overlap.modes import SELECTOR_MODES, Mode, Phase, StepDecision
from sglang_overlap.planning.selector import ModeSelector
from sglang_overlap.planning.step_table import NUM_BUCKETS, Cell, StepTable, format_rows

logger = logging.getLogger("sglang_overlap")

TABLE_LOG_STEPS = 4096
RIDE_WAIT = 4  # broadcast: a share waits this many sync periods for a list carrying requests
_CELLS_PER_PHASE = NUM_BUCKETS * len(SELECTOR_MODES)


Transport = Literal["broadcast", "all_reduce"]


class SelectorShare(NamedTuple):
    """The TP leader's new measurements, riding SGLang's request broadcast (`broadcast`)."""

    cells: tuple[Cell, ...]  # (cell, count, total us, squares us^2), `StepTable.take`


class SelectorRuntime:
    """This process's mode selector and the measurements not yet shared with the other ranks."""

    def __init__(self, selector: ModeSelector, *, sync_steps: int, cuda: bool, setup: str,
                 transport: Transport = "all_reduce", source: bool = True,
                 group: Callable[[], Any] | None = None) -> None:
        if transport not in ("broadcast", "all_reduce"):
            raise ValueError(f"SelectorRuntime: transport must be broadcast or all_reduce "
                             f"(got {transport!r})")
        self.selector = selector
        self.group = group or _tp_cpu_group  # the ranks that must decide alike
        self.sync_steps = sync_steps
        self.cuda = cuda
        self.setup = setup
        self.transport = transport
        self.source = source  # this rank's step times are shared (broadcast: the leader only)
        self.local = StepTable()  # this rank's measurements since the last share
        self._touched: dict[int, None] = {}  # cells of `local` with data, in first-seen order
        self._keys: list[int] = []  # all_reduce: every cell decided so far (same on all ranks)
        self._key_set: set[int] = set()
        self._seen: set[int] = set()  # (phase, mode)s timed once already (the first is dropped)
        self.calls = 0
        self.syncs = 0
        self._shared_at = 0  # broadcast: `calls` when the leader last attached a share
        self._events: deque[tuple[int, Any, Any]] = deque()
        self._logged_at = 0

    # -- decisions ------------------------------------------------------------------------
    def tick(self) -> None:
        """Once per selector call, before deciding; with `all_reduce`, every `sync_steps` calls,
        share measurements. Called at the same points on every rank (see dp_attn.py)."""
        self.calls += 1
        if self.transport == "all_reduce" and self.calls % self.sync_steps == 0:
            self.sync()

    def decide(self, phase: Phase | str, tokens: list[int],
               available: frozenset[Mode] | None = None) -> StepDecision:
        """This step's decision (`ModeSelector.decide`); with `all_reduce`, its cell joins the
        cells shared from now on (the same cells, in the same order, on every rank)."""
        decision = self.selector.decide(phase, tokens, available)
        cell = decision.cell
        if cell is not None and self.transport == "all_reduce" and cell not in self._key_set:
            self._key_set.add(cell)
            self._keys.append(cell)
        return decision

    def timed_cell(self, decision: StepDecision) -> int | None:
        """The cell a forward running `decision` is timed into: its cell (only the selector's
        decisions have one) on a rank whose times are shared, else None (not timed)."""
        return decision.cell if self.source else None

    def record(self, cell: int, us: float) -> None:
        """One timed step. The first step of each (phase, mode) in this process is dropped: it
        carries one-off costs (allocations, kernel JIT) the mode does not have in steady state.
        The others enter clipped (`ModeSelector.clip`: a host hiccup counts as at most 1.5x the
        cell's mean). Ranks may drop or clip different steps; what they share is still the same
        everywhere."""
        key = cell // _CELLS_PER_PHASE * len(SELECTOR_MODES) + cell % len(SELECTOR_MODES)
        if key in self._seen:
            self.local.add(cell, self.selector.clip(cell, us))
            self._touched[cell] = None
        else:
            self._seen.add(key)

    def push_events(self, cell: int, start: Any, end: Any) -> None:
        self._events.append((cell, start, end))
        self.poll()

    def poll(self) -> None:
        """Read the CUDA events that have completed (never waits)."""
        events = self._events
        while events and events[0][2].query():
            cell, start, end = events.popleft()
            self.record(cell, start.elapsed_time(end) * 1e3)

    # -- sharing: broadcast -----------------------------------------------------------------
    def outgoing(self, riding: bool = True) -> SelectorShare | None:
        """On the TP leader, before SGLang broadcasts its request list: the measurements to
        attach (None: nothing now). `riding`: the list carries requests, so it is pickled and
        sent anyway and a share costs nothing more; an empty list is one size message, which a
        share would double. So a share waits `sync_steps` selector calls for a list that carries
        requests, and goes on an empty one only after `RIDE_WAIT` times that."""
        waited = self.calls - self._shared_at
        if waited < self.sync_steps or (not riding and waited < RIDE_WAIT * self.sync_steps):
            return None
        self.poll()
        if not self._touched:
            return None
        self._shared_at = self.calls
        cells = self.local.take(self._touched)
        self._touched.clear()
        return SelectorShare(tuple(cells))

    def incoming(self, share: SelectorShare) -> None:
        """On every rank, after the broadcast that carried `share` (the leader included)."""
        self._merged(share.cells)

    # -- sharing: all_reduce ----------------------------------------------------------------
    def sync(self) -> None:
        """Sum every rank's new measurements and merge them (a collective: all ranks call it)."""
        self.poll()
        keys = self._keys
        if not keys:
            return  # nothing decided yet, on any rank (the keys are the same everywhere)
        local = self.local
        vector = ([local.counts[c] for c in keys] + [local.totals[c] for c in keys]
                  + [local.squares[c] for c in keys])
        local.take(keys)
        self._touched.clear()
        summed = _all_reduce(vector, self.group)
        n = len(keys)
        self._merged([(c, summed[i], summed[n + i], summed[2 * n + i])
                      for i, c in enumerate(keys) if summed[i]])

    def _merged(self, cells: list[Cell] | tuple[Cell, ...]) -> None:
        self.selector.merge_cells(cells)
        self.syncs += 1
        if self.selector.steps - self._logged_at >= TABLE_LOG_STEPS:
            self._logged_at = self.selector.steps
            self.log_table()

    def log_table(self) -> None:
        sel = self.selector
        rows = format_rows(sel.table.rows())
        logger.info("sglang-overlap gate: learned step times after %d steps (%d explored; "
                    "prior %s):\n%s", sel.steps, sel.explored, sel.prior.name,
                    rows or "(nothing measured yet)")


def _tp_cpu_group() -> Any:
    from sglang.srt.runtime_context import get_parallel

    return get_parallel().tp_group.cpu_group


def _all_reduce(vector: list[int], group_of: Callable[[], Any]) -> list[int]:
    """Element-wise sum over the group's ranks (integers: the same result on every rank)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return vector
    group = group_of()
    if dist.get_world_size(group) <= 1:
        return vector
    t = torch.tensor(vector, dtype=torch.int64)
    dist.all_reduce(t, group=group)
    return [int(x) for x in t.tolist()]


