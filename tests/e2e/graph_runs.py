"""Servers that decode through SGLang's own `DecodeCudaGraphRunner` on the CPU (the kit's
stand-in graph backend, SGLANG_CPU_SHIM_GRAPHS=1), each started once per test session.

Every server answers overlap_runs' fixed prompts (LONG alone, then BATCH of six as one request:
decode batches of 6 replay the graph of 8, LONG's single request the smallest captured size)
and reports, per TP rank, how many captures and replays its stand-in backend ran
(`sglang_cpu_shim.graphs.Counters.snapshot`, read from SGLANG_CPU_SHIM_COUNTERS).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overlap_runs import A2A, BATCH, LONG, NEW_TOKENS
from servers import Server

GRAPH_BS = ["--cuda-graph-bs-decode", "1", "2", "4", "8"]
GRAPH_ENV = {"SGLANG_CPU_SHIM_GRAPHS": "1"}
# SGLang's own DeepEP dispatcher on the kit's deep_ep stand-in (per-expert tree), unquantized
# low-latency dispatch, an emulated SM90 for DeepEP's sizing and the plugin's SBO decision.
DEEPEP = ["--tp", "2", "--dtype", "float32", "--moe-a2a-backend", "deepep", "--deepep-mode",
          "low_latency", "--deepep-dispatcher-output-dtype", "bf16"]
# LL dispatch takes at most N tokens per rank, prefill included: N = 512 holds LONG's prefill.
DEEPEP_ENV = {"SGLANG_CPU_SHIM_DEEPEP": "1", "SGLANG_OVERLAP_ASSUME_ARCH": "sm90",
              "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK": "512"}
CONFIGS: dict[str, tuple[list[str], dict[str, str]]] = {
    "graphs_tbo": ([*A2A, "--enable-two-batch-overlap", *GRAPH_BS], GRAPH_ENV),
    "graphs_sbo": ([*A2A, "--enable-single-batch-overlap", *GRAPH_BS], GRAPH_ENV),
    "deepep_graphs": ([*DEEPEP, *GRAPH_BS], {**GRAPH_ENV, **DEEPEP_ENV}),
    # TBO on SGLang's DeepEP path: two inner DeepEP dispatchers with receive hooks, the
    # decode operations of `operations_strategy._compute_moe_deepseek_blog_decode`
    "deepep_graphs_tbo": ([*DEEPEP, "--enable-two-batch-overlap", *GRAPH_BS],
                          {**GRAPH_ENV, **DEEPEP_ENV}),
    # SBO on SGLang's DeepEP path without the down-GEMM/combine overlap: the shared expert runs
    # in the dispatch hook (`SboFlags.enable_dispatch_shared_one_stream_overlap`, SM90)
    "deepep_graphs_sbo_shared": ([*DEEPEP, "--enable-single-batch-overlap",
                                  "--sbo-down-gemm-overlap", "off", *GRAPH_BS],
                                 {**GRAPH_ENV, **DEEPEP_ENV}),
}
PORT = 30300


@dataclass(frozen=True)
class GraphRun:
    ids: list[list[int]]
    """Greedy token ids of [LONG, *BATCH], as overlap_runs.Run.ids."""
    log: str
    counters: list[dict[str, Any]]
    """One snapshot per process that ran the stand-in backend (one per TP rank)."""

    def by_rank(self) -> dict[int, dict[str, Any]]:
        return {int(c["rank"]): c for c in self.counters}


class GraphRuns:
    """name -> GraphRun, each configuration's server started on first use."""

    def __init__(self, model: Path, env: dict[str, str], log_dir: Path,
                 deepep_pythonpath: str = "") -> None:
        """`deepep_pythonpath`: PYTHONPATH for the deepep servers (env's, with the kit's
        deep_ep / deep_gemm stand-ins: `Kit.env(..., deepep_form=...)`)."""
        self.model, self.env, self.log_dir = model, env, log_dir
        self.deepep_pythonpath = deepep_pythonpath
        self._runs: dict[str, GraphRun] = {}

    def __getitem__(self, name: str) -> GraphRun:
        if name not in self._runs:
            self._runs[name] = self._run(name)
        return self._runs[name]

    def _run(self, name: str) -> GraphRun:
        flags, env = CONFIGS[name]
        if "SGLANG_CPU_SHIM_DEEPEP" in env:
            env = {**env, "PYTHONPATH": self.deepep_pythonpath}
        counters = self.log_dir / f"{name}-counters"
        counters.mkdir()
        server = Server(name, self.model, PORT + list(CONFIGS).index(name), flags,
                        {**self.env, **env, "SGLANG_CPU_SHIM_COUNTERS": str(counters)},
                        self.log_dir)
        with server:
            ids = server.generate([LONG], NEW_TOKENS) + server.generate(BATCH, NEW_TOKENS)
            log = server.log_text()
        snaps = [json.loads(p.read_text()) for p in sorted(counters.glob("graphs-*.json"))]
        return GraphRun(ids, log, snaps)
