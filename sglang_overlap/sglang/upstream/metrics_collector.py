"""Hook on `sglang.srt.observability.metrics_collector`: the plugin's series in SGLang's /metrics.

With `--enable-metrics`, SGLang runs prometheus_client in multiprocess mode: the launcher sets
PROMETHEUS_MULTIPROC_DIR before it starts the schedulers, each scheduler that exports metrics
builds a `SchedulerMetricsCollector` (by default the first attention-TP rank of each DP group;
every rank with `--enable-metrics-for-all-schedulers`) and writes its values to files there, and
GET /metrics on the HTTP server sums them. The plugin adds its series from the same processes at
the same moments: after every `SchedulerMetricsCollector.log_stats` (each prefill batch, every
`--decode-log-interval` decode batches, and when the scheduler goes idle), this process's counters
from `sglang_overlap.stats` and the gate's learned table are written, with the collector's own
labels (model_name, engine_type, tp_rank, pp_rank, moe_ep_rank, dp_rank where set), so each
scheduler process has its own series and the endpoint never adds one rank's steps to another's.

Series (counters add only what changed since the last write, so values are never counted twice):
    sglang_overlap_steps_total{phase, mode, runner}          forward steps; runner graph | eager
    sglang_overlap_eager_fallbacks_total{mode, reason}       steps in the graph range run eagerly
    sglang_overlap_gate_decisions_total{phase, mode}         --overlap-gating auto: mode chosen
    sglang_overlap_gate_decision_changes_total{phase}        ... differing from the last step's
    sglang_overlap_gate_explored_steps_total{phase, mode}    ... run to measure a mode
    sglang_overlap_gate_step_time_seconds{phase, bucket, mode}  learned mean step time (gauge);
                                                             bucket: busiest rank's tokens, "16-19"
    sglang_overlap_gate_step_samples{phase, bucket, mode}    steps behind that mean (gauge)
    sglang_overlap_info{sbo_path, sbo_producer, deep_gemm_version, deep_ep_version, guard}  = 1
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_overlap import stats
from sglang_overlap.modes import Feature
from sglang_overlap.sglang.hooks import HookSpec

logger = logging.getLogger("sglang_overlap")

LOG_STATS = "sglang.srt.observability.metrics_collector.SchedulerMetricsCollector.log_stats"
PREFIX = "sglang_overlap"

# stats series -> (metric name without _total, help)
COUNTERS: dict[str, tuple[str, str]] = {
    "steps": ("steps", "Forward steps by phase, overlap mode and runner (graph or eager)."),
    "eager_fallbacks": ("eager_fallbacks", "Steps in the CUDA-graph range that ran eagerly."),
    "decisions": ("gate_decisions", "--overlap-gating auto: steps by the mode chosen."),
    "decision_changes": ("gate_decision_changes", "--overlap-gating auto: steps whose mode "
                         "(or being an exploration) differs from the phase's last step."),
    "explored_steps": ("gate_explored_steps", "--overlap-gating auto: steps run to measure "
                       "a mode."),
    "sbo_producer_launches": ("sbo_producer_launches", "SBO down GEMMs issued by the host, by "
                              "the producer that ran (deepgemm, fused, sliced); a CUDA graph "
                              "counts once, at capture."),
}
INFO_LABELS = ("sbo_path", "sbo_producer", "deep_gemm_version", "deep_ep_version", "guard")
TABLE_LABELS = ("phase", "bucket", "mode")


class Exporter:
    """This process's prometheus_client metrics, created on the first write (prometheus_client
    must be imported after PROMETHEUS_MULTIPROC_DIR is set, as SGLang's own collectors are)."""

    def __init__(self, labels: dict[str, Any]) -> None:
        from prometheus_client import Counter, Gauge

        self.labels = {k: str(v) for k, v in labels.items()}
        base = tuple(self.labels)
        self.counters = {
            series: Counter(f"{PREFIX}_{name}", doc, (*base, *stats.SERIES[series]),
                            registry=None)
            for series, (name, doc) in COUNTERS.items()}
        self.step_time = Gauge(f"{PREFIX}_gate_step_time_seconds", "--overlap-gating auto: "
                               "the learned mean step time per phase, token bucket and mode.",
                               (*base, *TABLE_LABELS), registry=None,
                               multiprocess_mode="mostrecent")
        self.samples = Gauge(f"{PREFIX}_gate_step_samples", "--overlap-gating auto: steps "
                             "behind each learned mean.", (*base, *TABLE_LABELS), registry=None,
                             multiprocess_mode="mostrecent")
        self.info = Gauge(f"{PREFIX}_info", "The plugin's SBO path and kernels (value 1).",
                          (*base, *INFO_LABELS), registry=None, multiprocess_mode="mostrecent")
        self.written: dict[str, dict[tuple[str, ...], int]] = {s: {} for s in COUNTERS}
        self.info.labels(**self.labels, **info_labels()).set(1)

    def write(self, snapshot: dict[str, dict[tuple[str, ...], int]],
              table: dict[str, Any] | None) -> None:
        """Add each counter's growth since the last write; set the gate table's gauges."""
        for series, values in snapshot.items():
            if series not in self.counters:
                continue
            done = self.written[series]
            names = stats.SERIES[series]
            for key, value in values.items():
                if value > done.get(key, 0):
                    self.counters[series].labels(**self.labels, **dict(zip(names, key,
                                                                           strict=True))
                                                 ).inc(value - done.get(key, 0))
                    done[key] = value
        for row in (table or {}).get("rows", ()):
            cell = {**self.labels, "phase": row["phase"], "bucket": bucket_label(*row["tokens"]),
                    "mode": row["mode"]}
            self.step_time.labels(**cell).set(row["mean_ms"] / 1e3)
            self.samples.labels(**cell).set(row["count"])


def bucket_label(lo: int, hi: int) -> str:
    """The token range of a gate bucket as a label value: "16-19", "1", "65536-inf"."""
    if lo == hi:
        return str(lo)
    return f"{lo}-{hi if hi < 1 << 62 else 'inf'}"


def info_labels() -> dict[str, str]:
    """The SBO path this process serves, its down-GEMM producer, the kernel versions and the
    version guard's verdict."""
    from sglang_overlap.kernels.package_source import package_version
    from sglang_overlap.sglang import sbo_decision, state
    from sglang_overlap.sglang.upstream import server_args

    path, producer = sbo_served(state.settings(), sbo_decision.active_decision())
    verdict = server_args._verdict.get("verdict")  # noqa: SLF001 - the guard's, set at register
    off = sorted(verdict.off) if verdict is not None else []
    return {"sbo_path": path, "sbo_producer": producer,
            "deep_gemm_version": package_version("deep_gemm") or "none",
            "deep_ep_version": package_version("deep_ep") or "none",
            "guard": "off: " + ",".join(off) if off else "ok"}


def sbo_served(settings: Any, decision: Any) -> tuple[str, str]:
    """(SBO path, down-GEMM producer): off; torch_a2a (the plugin's torch experts mark each
    unit as it finishes); the path the plugin chose on SM90 (`moe_utils.py`); else upstream
    (SGLang's own SBO: SM100, or a GPU the table does not speak for)."""
    if not settings.enable_single_batch_overlap:
        return "off", "none"
    if settings.requested_a2a_backend == "torch_a2a":
        return "torch_a2a", "torch_experts"
    if decision is None or decision.path is None:
        return "upstream", "upstream"
    if not decision.down_gemm_overlap:
        return str(decision.path.value), "none"
    from sglang_overlap.kernels.down_gemm import deepgemm_signal_unavailable

    return (str(decision.path.value),
            "triton" if deepgemm_signal_unavailable() else "patched_deepgemm")


def gate_table() -> dict[str, Any] | None:
    """The mode selector's learned table (the one GET /server_info serves), None without auto
    gating."""
    from sglang_overlap.sglang import selector_setup
    from sglang_overlap.sglang.upstream.internal_state import served_table

    rt = selector_setup.runtime()
    return None if rt is None else served_table(rt)


_exporter: list[Exporter] = []
_warned: set[str] = set()


def export(result: Any, collector: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER `log_stats`: write this process's series next to SGLang's own."""
    try:
        if not _exporter:
            _exporter.append(Exporter(dict(collector.labels)))
        _exporter[0].write(stats.snapshot(), gate_table())
    except Exception:  # metrics must never stop serving
        if not _warned:
            _warned.add("export")
            logger.warning("sglang-overlap metrics: export failed", exc_info=True)


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(LOG_STATS, export, "after",
             "--enable-metrics: the plugin's counters and gate table beside SGLang's own series",
             "src:ddc680185611", feature=Feature.METRICS),
)
