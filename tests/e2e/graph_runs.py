"""Servers that decode through SGLang's own `DecodeCudaGraphRunner` on the CPU (the kit's
stand-in graph backend, SGLANG_CPU_SHIM_GRAPHS=1), each started once per test session, on first
use; the next of those the session's tests name loads while it answers.

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

from overlap_runs import A2A, BATCH, LONG, NEW_TOKENS, Probes, _probe
from servers import Lineup, Server

GRAPH_BS = ["--cuda-graph-bs-decode", "1", "2", "4", "8"]
GRAPH_ENV = {"SGLANG_CPU_SHIM_GRAPHS": "1"}
# SGLang's own DeepEP dispatcher on the kit's deep_ep stand-in (per-expert tree), unquantized
# low-latency dispatch, an emulated SM90 for DeepEP's sizing and the plugin's SBO decision.
DEEPEP = ["--tp", "2", "--dtype", "float32", "--moe-a2a-backend", "deepep", "--deepep-mode",
          "low_latency", "--deepep-dispatcher-output-dtype", "bf16"]
# LL dispatch takes at most N tokens per rank, prefill included: N = 512 holds LONG's prefill.
DEEPEP_ENV = {"SGLANG_CPU_SHIM_DEEPEP": "1", "SGLANG_OVERLAP_ASSUME_ARCH": "sm90",
              "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK": "512"}
# Prefill chunks of at most the low-latency dispatch's N tokens per rank, as a GPU server serving
# prefill in low-latency mode must: the reliability probes' longest prompt then fits.
DEEPEP_CHUNKS = ["--chunked-prefill-size",
                 DEEPEP_ENV["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"]]
# `--deepep-mode auto`, as configs/h200-single-deepseek-v3.toml: prefill in DeepEP's normal mode
# (the kit's normal_experts.py; no per-rank token limit, so no prefill chunks), decode in
# low-latency mode through the graphs
DEEPEP_AUTO = [("auto" if f == "low_latency" else f) for f in DEEPEP]
# The experts as SGLang's DeepGEMM runner computes an fp8 checkpoint's (the kit's deepep.py):
# the path SBO's signal down GEMM is on. Its servers compare with "deepep_graphs_fp8".
FP8_ENV = {**DEEPEP_ENV, "SGLANG_CPU_SHIM_DEEPEP_FP8": "1"}
SBO_SIGNAL = ["--enable-single-batch-overlap", "--sbo-down-gemm-overlap", "force"]
# ... dispatched in fp8 (DeepEP's 1 x 128 scales), as an fp8 checkpoint's server dispatches
FP8_DEEPEP = [*DEEPEP[:-1], "fp8", *DEEPEP_CHUNKS]
FP8_DEEPEP_AUTO = [*DEEPEP_AUTO[:-1], "fp8"]


@dataclass(frozen=True)
class GraphServer:
    flags: list[str]
    env: dict[str, str]
    deepep_form: str | None = None
    """The kit's deep_ep / deep_gemm stand-ins of this combine form on PYTHONPATH."""
    baseline: str | None = "a2a"
    """Whose greedy tokens it must give: overlap_runs' "a2a", a CONFIGS name, or None for a
    baseline of other numerics (the fp8 experts)."""
    probed: bool = False
    """Answers test_reliability.py's probes after the prompts, as its baseline does (the
    server without the plugin, or the fp8 server's own probes)."""


CONFIGS: dict[str, GraphServer] = {
    "graphs_tbo": GraphServer([*A2A, "--enable-two-batch-overlap", *GRAPH_BS], GRAPH_ENV),
    "graphs_sbo": GraphServer([*A2A, "--enable-single-batch-overlap", *GRAPH_BS], GRAPH_ENV),
    "deepep_graphs": GraphServer([*DEEPEP, *GRAPH_BS], {**GRAPH_ENV, **DEEPEP_ENV},
                                 "per_expert"),
    # TBO on SGLang's DeepEP path: two inner DeepEP dispatchers with receive hooks, the
    # decode operations of `operations_strategy._compute_moe_deepseek_blog_decode`
    "deepep_graphs_tbo": GraphServer([*DEEPEP, *DEEPEP_CHUNKS, "--enable-two-batch-overlap",
                                      *GRAPH_BS], {**GRAPH_ENV, **DEEPEP_ENV}, "per_expert",
                                     probed=True),
    # SBO on SGLang's DeepEP path without the down-GEMM/combine overlap: the shared expert runs
    # in the dispatch hook (`SboFlags.enable_dispatch_shared_one_stream_overlap`, SM90)
    "deepep_graphs_sbo_shared": GraphServer(
        [*DEEPEP, "--enable-single-batch-overlap", "--sbo-down-gemm-overlap", "off", *GRAPH_BS],
        {**GRAPH_ENV, **DEEPEP_ENV}, "per_expert"),
    "deepep_graphs_auto": GraphServer([*DEEPEP_AUTO, *GRAPH_BS], {**GRAPH_ENV, **DEEPEP_ENV},
                                      "per_expert"),
    # TBO on both: prefill's two micro-batches each through normal dispatch/combine (upstream's
    # prefill operations), decode's through low-latency
    "deepep_graphs_auto_tbo": GraphServer(
        [*DEEPEP_AUTO, "--enable-two-batch-overlap", *GRAPH_BS], {**GRAPH_ENV, **DEEPEP_ENV},
        "per_expert"),
    # fp8 experts, no overlap: the tokens the SBO signal servers must give
    "deepep_graphs_fp8": GraphServer([*FP8_DEEPEP, *GRAPH_BS], {**GRAPH_ENV, **FP8_ENV},
                                     "per_expert", baseline=None, probed=True),
    # full SBO: the shared expert in the dispatch hook, the plugin's signal down GEMM beside the
    # combine send on SGLang's combine stream, in the installed tree's form
    "deepep_graphs_sbo_expert": GraphServer([*FP8_DEEPEP, *SBO_SIGNAL, *GRAPH_BS],
                                            {**GRAPH_ENV, **FP8_ENV}, "per_expert",
                                            "deepep_graphs_fp8", probed=True),
    "deepep_graphs_sbo_block": GraphServer([*FP8_DEEPEP, *SBO_SIGNAL, *GRAPH_BS],
                                           {**GRAPH_ENV, **FP8_ENV}, "per_block",
                                           "deepep_graphs_fp8", probed=True),
}
PORT = 30300


@dataclass(frozen=True)
class GraphRun:
    ids: list[list[int]]
    """Greedy token ids of [LONG, *BATCH], as overlap_runs.Run.ids."""
    log: str
    counters: list[dict[str, Any]]
    """One snapshot per process that ran the stand-in backend (one per TP rank)."""
    probes: Probes | None = None
    probe_log: str = ""
    """The server's log up to the probes' ending case (probed servers)."""

    def by_rank(self) -> dict[int, dict[str, Any]]:
        return {int(c["rank"]): c for c in self.counters}


class GraphRuns:
    """name -> GraphRun, each configuration's server started on first use."""

    def __init__(self, model: Path, env: dict[str, str], log_dir: Path,
                 deepep_pythonpath: dict[str, str] | None = None,
                 planned: list[str] | None = None) -> None:
        """`deepep_pythonpath`: combine form -> PYTHONPATH for the deepep servers of that form
        (env's, with the kit's deep_ep / deep_gemm stand-ins: `Kit.env(..., deepep_form=...)`).
        `planned`: the names the tests will ask for, in that order: asking for one starts the
        next one not run yet (their answers are compared, not timed). `close` stops those."""
        self.model, self.env, self.log_dir = model, env, log_dir
        self.deepep_pythonpath = deepep_pythonpath or {}
        self.planned = planned or []
        self._runs: dict[str, GraphRun] = {}
        self._lineup = Lineup()

    def __getitem__(self, name: str) -> GraphRun:
        if name not in self._runs:
            server = self._lineup.take_planned(
                self._server(name), [self._server(n) for n in self.planned if n not in self._runs])
            self._runs[name] = self._answer(server)
            self._lineup.done(server)
        return self._runs[name]

    def close(self) -> None:
        self._lineup.close()

    def _server(self, name: str) -> Server:
        config = CONFIGS[name]
        env = config.env
        if config.deepep_form is not None:
            env = {**env, "PYTHONPATH": self.deepep_pythonpath[config.deepep_form]}
        counters = self.log_dir / f"{name}-counters"
        counters.mkdir(exist_ok=True)
        return Server(name, self.model, PORT + list(CONFIGS).index(name), config.flags,
                      {**self.env, **env, "SGLANG_CPU_SHIM_COUNTERS": str(counters)},
                      self.log_dir)

    def _answer(self, server: Server) -> GraphRun:
        config, counters = CONFIGS[server.name], self.log_dir / f"{server.name}-counters"
        ids = server.generate([LONG], NEW_TOKENS) + server.generate(BATCH, NEW_TOKENS)
        log = server.log_text()
        snaps = [json.loads(p.read_text()) for p in sorted(counters.glob("graphs-*.json"))]
        found, probe_log = _probe(server) if config.probed else (None, "")
        return GraphRun(ids, log, snaps, found, probe_log)
