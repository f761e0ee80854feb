"""The per-step overlap gate of this server (--overlap-gating auto): built when the model runner
starts, fed this server's measured step times, the same decisions on every rank.

Built from what is actually served (`build_gate`): the model profile from the served model's HF
config (`planning.cost.model_config`), the deployment from the real parallel layout (EP size,
attention DP, nodes), the prior from --overlap-hardware-profile, resolved here, once per process,
at start-up (`resolve_prior`): a named or JSON profile is the cost model on it; `auto` is the
cost model on the detected GPU's shipped profile, or - on a CPU, or a GPU without a shipped
profile - a flat prior (measurements alone decide), logged once.

`GateRuntime` carries the measurements: the forward hook (`model_runner.py`) times each gated
step into this rank's `local` table (wall time on CPU; on GPU two CUDA events, read only once
they have completed, so the hot path adds no device sync). The gate merges new measurements at
the same point on every rank, so its inputs stay identical everywhere, and so do its decisions.
How they travel depends on the layout, and neither way adds a collective of its own per step:

* `broadcast` (no attention DP: every TP rank runs the same batch, in lockstep through the
  model's collectives): only the TP leader times its steps. After --overlap-gating-sync-steps
  gate calls it attaches its new measurements (`GateShare`, a few (cell, count, total) triples)
  to the next request list SGLang broadcasts from it to the other TP ranks (at the start of every
  scheduler iteration, anyway) that carries requests, or to an empty one after `RIDE_WAIT` times
  as many calls (`request_receiver.py`); each rank takes the share out of the list and merges it
  there. The other ranks time nothing.
* `all_reduce` (attention DP: each DP rank runs its own batch): every
  --overlap-gating-sync-steps gate calls, `tick` sums the ranks' new measurements with one
  all-reduce over the tensor-parallel CPU group, sparse: one pair of integers per cell the gate
  has ever decided (the same cells, in the same order, on every rank).

The learned table is logged every `TABLE_LOG_STEPS` steps and at exit, and served in GET
/server_info (`internal_state.py`).
"""

from __future__ import annotations

import atexit
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from sglang_overlap.planning.cost.model_config import model_from_hf_config
from sglang_overlap.planning.cost.prior import CostModelPrior, FlatPrior, Prior
from sglang_overlap.planning.cost.profiles import (
    Deployment,
    ModelProfile,
    ProfileError,
    deployment_for_server,
    load_hardware,
    resolve_hardware,
)
from sglang_overlap.planning.gating import Gate, GateConfig, GateDecision
from sglang_overlap.planning.step_table import (
    MODES,
    NUM_BUCKETS,
    StepTable,
    cell_index,
    format_rows,
)
from sglang_overlap.settings import OverlapSettings
from sglang_overlap.sglang import state

logger = logging.getLogger("sglang_overlap")

TABLE_LOG_STEPS = 4096
RIDE_WAIT = 4  # broadcast: a share waits this many sync periods for a list carrying requests
_CELLS_PER_PHASE = NUM_BUCKETS * len(MODES)
FLAG = "--overlap-hardware-profile"


def enabled_modes(s: OverlapSettings) -> frozenset[str]:
    enabled: set[str] = set()
    if s.enable_two_batch_overlap:
        enabled |= {"tbo", "two_chunk"} if s.two_chunk_enabled else {"tbo"}
    if s.enable_single_batch_overlap:
        enabled.add("sbo")
    return frozenset(enabled)


def resolve_prior(s: OverlapSettings, model: ModelProfile, deploy: Deployment, *,
                  device: str, device_name: str | None) -> tuple[Prior, str]:
    """(the prior, one line saying how --overlap-hardware-profile was resolved). Raises
    ProfileError naming the flag for a profile that cannot be used."""
    enabled = enabled_modes(s)
    spec = s.overlap_hardware_profile
    if spec != "auto":
        try:
            hw = load_hardware(spec)
        except ProfileError as exc:
            raise ProfileError(f"{FLAG} {spec}: {exc}") from None
        return CostModelPrior(model, hw, deploy, enabled), f"{FLAG} {spec}: cost model on {hw.name}"
    if device != "cuda" or not device_name:
        why = f"{FLAG} auto on device {device!r}: no GPU profile applies"
        return FlatPrior(enabled, "no GPU profile"), f"{why}; measurements alone decide"
    try:
        hw = resolve_hardware("auto", device_name)
    except ProfileError:
        why = f"{FLAG} auto: no shipped profile for {device_name!r}"
        return FlatPrior(enabled, f"no profile for {device_name}"), (
            f"{why}; measurements alone decide (pass {FLAG} with a profile JSON from "
            "benchmarks/calibrate.py for a cost-model prior)")
    return CostModelPrior(model, hw, deploy, enabled), (
        f"{FLAG} auto: device {device_name!r} -> cost model on {hw.name}")


def gate_config(s: OverlapSettings) -> GateConfig:
    return GateConfig(hysteresis=s.overlap_gating_hysteresis, min_trials=s.overlap_gating_trials,
                      explore_share=s.overlap_gating_explore)


Transport = Literal["broadcast", "all_reduce"]


class GateShare(NamedTuple):
    """The TP leader's new measurements, riding SGLang's request broadcast (`broadcast`)."""

    cells: tuple[tuple[int, int, int], ...]  # (cell, count, total us), `StepTable.take`


class GateRuntime:
    """This process's gate and the measurements not yet shared with the other ranks."""

    def __init__(self, gate: Gate, *, sync_steps: int, cuda: bool, setup: str,
                 transport: Transport = "all_reduce", source: bool = True,
                 group: Callable[[], Any] | None = None) -> None:
        if transport not in ("broadcast", "all_reduce"):
            raise ValueError(f"GateRuntime: transport must be broadcast or all_reduce "
                             f"(got {transport!r})")
        self.gate = gate
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
        self.pending: int | None = None  # the cell of the step decided, until its forward
        self._events: deque[tuple[int, Any, Any]] = deque()
        self._logged_at = 0

    # -- decisions ------------------------------------------------------------------------
    def tick(self) -> None:
        """Once per gate call, before deciding; with `all_reduce`, every `sync_steps` calls,
        share measurements. Called at the same points on every rank (see dp_attn.py)."""
        self.calls += 1
        if self.transport == "all_reduce" and self.calls % self.sync_steps == 0:
            self.sync()

    def expect(self, decision: GateDecision) -> None:
        """The next forward is `decision`'s step: time it into that cell (on a rank whose
        times are shared)."""
        if decision.busiest <= 0:
            self.pending = None
            return
        cell = cell_index(decision.phase, decision.bucket, decision.mode)
        if self.transport == "all_reduce" and cell not in self._key_set:
            self._key_set.add(cell)
            self._keys.append(cell)
        self.pending = cell if self.source else None

    # -- measurements ---------------------------------------------------------------------
    def take_pending(self) -> int | None:
        cell, self.pending = self.pending, None
        return cell

    def record(self, cell: int, us: float) -> None:
        """One timed step. The first step of each (phase, mode) in this process is dropped: it
        carries one-off costs (allocations, kernel JIT) the mode does not have in steady state.
        Ranks may drop different steps; what they share is still the same everywhere."""
        key = cell // _CELLS_PER_PHASE * len(MODES) + cell % len(MODES)
        if key in self._seen:
            self.local.add(cell, us)
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
    def outgoing(self, riding: bool = True) -> GateShare | None:
        """On the TP leader, before SGLang broadcasts its request list: the measurements to
        attach (None: nothing now). `riding`: the list carries requests, so it is pickled and
        sent anyway and a share costs nothing more; an empty list is one size message, which a
        share would double. So a share waits `sync_steps` gate calls for a list that carries
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
        return GateShare(tuple(cells))

    def incoming(self, share: GateShare) -> None:
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
        vector = [local.counts[c] for c in keys] + [local.totals[c] for c in keys]
        local.take(keys)
        self._touched.clear()
        summed = _all_reduce(vector, self.group)
        n = len(keys)
        self._merged([(c, summed[i], summed[n + i]) for i, c in enumerate(keys) if summed[i]])

    def _merged(self, cells: list[tuple[int, int, int]] | tuple[tuple[int, int, int], ...]
                ) -> None:
        self.gate.merge_cells(cells)
        self.syncs += 1
        if self.gate.steps - self._logged_at >= TABLE_LOG_STEPS:
            self._logged_at = self.gate.steps
            self.log_table()

    def log_table(self) -> None:
        rows = format_rows(self.gate.table.rows())
        logger.info("sglang-overlap gate: learned step times after %d steps (%d explored; "
                    "prior %s):\n%s", self.gate.steps, self.gate.explored, self.gate.prior.name,
                    rows or "(nothing measured yet)")

    def table(self) -> dict[str, Any]:
        """The learned table, for GET /server_info and `sglang-overlap gate`."""
        return {
            "setup": self.setup, "prior": self.gate.prior.name, "steps": self.gate.steps,
            "explored": self.gate.explored, "syncs": self.syncs,
            "chosen": {f"{phase}/{mode}": n
                       for (phase, mode), n in sorted(self.gate.chosen.items())},
            "rows": [{"phase": r.phase, "tokens": [r.tokens_lo, r.tokens_hi], "mode": r.mode,
                      "count": r.count, "mean_ms": round(r.mean_us / 1e3, 4)}
                     for r in self.gate.table.rows()],
        }


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


def _model_profile(model_runner: Any) -> ModelProfile:
    cfg = model_runner.model_config
    hf = getattr(cfg, "hf_text_config", None) or cfg.hf_config
    return model_from_hf_config(hf.to_dict(), name=str(getattr(cfg, "model_path", "") or ""))


def _deployment(s: OverlapSettings, server_args: Any) -> Deployment:
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    tp = int(getattr(p, "tp_size", 0) or getattr(server_args, "tp_size", 1) or 1)
    try:
        ep = int(p.moe_ep_size)
        attn_dp = int(p.attn_dp_size)
    except (RuntimeError, ValueError, AttributeError):
        ep, attn_dp = tp, int(getattr(server_args, "attn_dp_size", 1) or 1)
    return deployment_for_server(ep_size=ep, tp_size=tp, attn_dp_size=attn_dp,
                                 nnodes=int(getattr(server_args, "nnodes", 1) or 1),
                                 two_chunk_threshold=s.tbo_token_distribution_threshold)


def build_runtime(model_runner: Any) -> GateRuntime:
    """The gate for the model `model_runner` serves, on this server's layout and device."""
    import torch
    from sglang.srt.runtime_context import get_server_args

    s = state.settings()
    model = _model_profile(model_runner)
    deploy = _deployment(s, get_server_args())
    device = str(getattr(model_runner, "device", "cpu"))
    name = torch.cuda.get_device_name() if device == "cuda" else None
    prior, how = resolve_prior(s, model, deploy, device=device, device_name=name)
    setup = (f"{how}; model {model.name} ({model.num_experts} experts, top-{model.topk}, "
             f"{model.num_moe_layers} MoE layers, {model.attn_kind}); EP {deploy.ep_size}, "
             f"{'DP' if deploy.dp_attention else 'TP'} attention")
    transport, source = _transport()
    return GateRuntime(Gate(prior, gate_config(s)), sync_steps=s.overlap_gating_sync_steps,
                       cuda=device == "cuda", setup=f"{setup}; measurements by {transport}",
                       transport=transport, source=source)


def _transport() -> tuple[Transport, bool]:
    """(how measurements travel, whether this rank's are shared) on this server's layout."""
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    if p.attn_dp_enabled:
        return "all_reduce", True
    # the rank that pulls requests and broadcasts them to its TP group (request_receiver.py)
    return "broadcast", p.attn_tp_rank == 0 and p.attn_cp_rank == 0


_runtime: list[GateRuntime] = []


def start(model_runner: Any) -> GateRuntime:
    """Build this process's gate (once) at start-up; logs how it was set up."""
    if not _runtime:
        _runtime.append(build_runtime(model_runner))
        logger.info("sglang-overlap gate: %s", _runtime[0].setup)
        atexit.register(_runtime[0].log_table)
    return _runtime[0]


def runtime() -> GateRuntime | None:
    """This process's gate runtime (None before the model runner started it)."""
    return _runtime[0] if _runtime else None


def set_runtime(rt: GateRuntime | None) -> None:
    """Replace (None: forget) this process's gate runtime; for tests and embedders."""
    _runtime.clear()
    if rt is not None:
        _runtime.append(rt)
