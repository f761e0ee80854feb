"""The mode selector (--overlap-gating auto) on real `--tp 2` CPU servers whose decode runs through
SGLang's own `DecodeCudaGraphRunner` (the kit's stand-in graph backend, SGLANG_CPU_SHIM_GRAPHS=1)
with TBO and SBO enabled: every decode step in the captured range replays a graph of the mode the
selector chose (one graph set per mode, `sglang/decode_cuda_graph_runner.py`), none runs eager,
the selector's table holds the replays' times, both ranks decide alike, and greedy tokens equal
the eager server's without overlap; and the reliability probes of test_reliability.py get the
answers of the server without the plugin. One server runs `--deepep-mode auto` as
configs/h200-single-deepseek-v3.toml does (prefill through DeepEP's normal mode, on the kit's
normal-mode stand-in).

Evidence is read where the server keeps it: the stand-in backend's captures and replays per
graph key and TP rank (SGLANG_CPU_SHIM_COUNTERS), the plugin's step counters and learned table
in GET /server_info, and each rank's logged decisions.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from graph_runs import (
    DEEPEP,
    DEEPEP_CHUNKS,
    DEEPEP_ENV,
    FP8_DEEPEP,
    FP8_DEEPEP_AUTO,
    FP8_ENV,
    GRAPH_BS,
    GRAPH_ENV,
    SBO_SIGNAL,
    GraphRuns,
)
from overlap_runs import (
    A2A,
    BATCH,
    LONG,
    NEW_TOKENS,
    OverlapRuns,
    Probes,
    _probe,
    assert_answers_as,
)
from servers import Lineup, Server, selected_params

from tests.conftest import REPO
from tests.kit import Kit

pytestmark = pytest.mark.e2e

AUTO = ["--overlap-gating", "auto", "--overlap-gating-explore", "0.5",
        "--overlap-gating-trials", "2", "--overlap-gating-sync-steps", "2"]
TBO, SBO = ["--enable-two-batch-overlap"], ["--enable-single-batch-overlap"]


@dataclass(frozen=True)
class Config:
    flags: list[str]
    modes: tuple[str, ...]
    """The decode modes the selector chooses among, one graph set each."""
    env: dict[str, str] = field(default_factory=dict)
    deepep: bool = False
    """On SGLang's DeepEP dispatcher with the kit's per-expert deep_ep / deep_gemm stand-ins."""
    baseline: str = "a2a"
    """Whose greedy tokens it must give: overlap_runs' "a2a" or a graph_runs server."""


CONFIGS = {
    "a2a_auto_graphs": Config([*A2A, *TBO, *SBO, *AUTO, *GRAPH_BS], ("tbo", "sbo", "none")),
    "deepep_auto_graphs": Config([*DEEPEP, *DEEPEP_CHUNKS, *TBO, *AUTO, *GRAPH_BS],
                                 ("tbo", "none"), DEEPEP_ENV, deepep=True),
    # every mode on SGLang's DeepEP path, SBO with the signal down GEMM (fp8 experts)
    "deepep_auto_sbo_graphs": Config([*FP8_DEEPEP, *TBO, *SBO_SIGNAL, *AUTO, *GRAPH_BS],
                                     ("tbo", "sbo", "none"), FP8_ENV, deepep=True,
                                     baseline="deepep_graphs_fp8"),
    # as configs/h200-single-deepseek-v3.toml: --deepep-mode auto (prefill through DeepEP's
    # normal mode), TBO and SBO chosen per step
    "deepep_mode_auto_graphs": Config([*FP8_DEEPEP_AUTO, *TBO, *SBO_SIGNAL, *AUTO, *GRAPH_BS],
                                      ("tbo", "sbo", "none"), FP8_ENV, deepep=True,
                                      baseline="deepep_graphs_fp8"),
}
MOE_LAYERS = 2  # the tiny model's: 3 layers, the first dense
PORT = 30340
DECISION = re.compile(r"(TP\d) EP\d\] sglang-overlap gate: ((?:decode|prefill) -> \w+)")


@dataclass(frozen=True)
class SelectorRun:
    modes: tuple[str, ...]
    name: str
    ids: list[list[int]]
    log: str
    table: dict[str, Any]  # the selector's /server_info entry (internal_state.served_table)
    counters: dict[int, dict[str, Any]]  # TP rank -> the stand-in backend's snapshot
    probes: Probes  # test_reliability.py's cases, sent after the counters were read
    probe_log: str

    def series(self, name: str) -> dict[tuple[str, ...], int]:
        return {tuple(row[:-1]): row[-1] for row in self.table["counters"].get(name, [])}


def _server_table(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/server_info", timeout=60) as r:
        info = json.loads(r.read())
    tables = [s["sglang_overlap_gate"] for s in info.get("internal_states") or []
              if isinstance(s, dict) and "sglang_overlap_gate" in s]
    assert len(tables) == 1, info.get("internal_states")
    return tables[0]


@pytest.fixture(scope="module")
def selector_servers(request: pytest.FixtureRequest, tiny_dsv3: Path, cpu_kit: Kit,
                     sglang_cpu_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[tuple[Lineup, dict[str, Server]]]:
    """The server of each configuration the selected tests use, in CONFIGS order (as pytest
    runs the `run` params), with the Lineup that loads the next while one answers."""
    used = selected_params(request.session.items, "run", module=request.module)
    out = {}
    for name in (n for n in CONFIGS if n in used):
        config, work = CONFIGS[name], tmp_path_factory.mktemp(name)
        (work / "counters").mkdir()
        env = {**sglang_cpu_env, **GRAPH_ENV, **config.env,
               "SGLANG_CPU_SHIM_COUNTERS": str(work / "counters")}
        if config.deepep:
            env["PYTHONPATH"] = cpu_kit.env(os.environ, pythonpath=[str(REPO)],
                                            deepep_form="per_expert")["PYTHONPATH"]
        out[name] = Server(name, tiny_dsv3, PORT + list(CONFIGS).index(name), config.flags,
                           env, work)
    lineup = Lineup()
    yield lineup, out
    lineup.close()


@pytest.fixture(scope="module", params=list(CONFIGS))
def run(request: Any, selector_servers: tuple[Lineup, dict[str, Server]]) -> SelectorRun:
    name, config = request.param, CONFIGS[request.param]
    lineup, planned = selector_servers
    server = lineup.take_planned(planned[name], list(planned.values()))
    counters = server.log.parent / "counters"
    try:
        ids = server.generate([LONG], NEW_TOKENS) + server.generate(BATCH, NEW_TOKENS)
        for _ in range(3):  # more decode steps at batch 6 and 1: each mode explored, measured
            server.generate(BATCH, NEW_TOKENS)
            server.generate([LONG], NEW_TOKENS)
        table = _server_table(server.url)
        log = server.log_text()
        snaps = [json.loads(p.read_text()) for p in sorted(counters.glob("graphs-*.json"))]
        found, probe_log = _probe(server)
    finally:
        lineup.done(server)
    return SelectorRun(config.modes, name, ids, log, table, {int(s["rank"]): s for s in snaps},
                       found, probe_log)


def test_greedy_tokens_equal_the_eager_server_without_overlap(
        run: SelectorRun, overlap_runs: OverlapRuns, graph_runs: GraphRuns) -> None:
    baseline = CONFIGS[run.name].baseline
    want = overlap_runs["a2a"].ids if baseline == "a2a" else graph_runs[baseline].ids
    for i, (w, h) in enumerate(zip(want, run.ids, strict=True)):
        assert h == w, f"prompt {i}: {h=} {w=}"


def test_every_shape_is_captured_once_per_mode_on_both_ranks(run: SelectorRun) -> None:
    assert set(run.counters) == {0, 1}, run.counters
    captures = run.counters[0]["captures"]
    assert captures == run.counters[1]["captures"]
    for mode in run.modes:  # the batch sizes TBO can split, in every mode's set
        for bs in (4, 8):
            key = [k for k in captures if f"size={bs}," in k and f"'overlap:{mode}'" in k]
            assert len(key) == 1 and captures[key[0]] == 1, (mode, bs, sorted(captures))


def test_decode_steps_replay_their_modes_graph_and_none_runs_eager(run: SelectorRun) -> None:
    replays = {0: run.counters[0]["replays"], 1: run.counters[1]["replays"]}
    assert replays[0] == replays[1], replays  # every step ran on both ranks, same graph
    by_mode = {m: sum(n for k, n in replays[0].items() if f"'overlap:{m}'" in k)
               for m in run.modes}
    assert sum(by_mode.values()) == sum(replays[0].values()), replays[0]  # no other graph
    steps = run.series("steps")
    decode = {m: steps.get(("decode", m, "graph"), 0) for m in run.modes}
    assert all(by_mode[m] > 0 for m in run.modes), (by_mode, replays[0])
    # the selector's own decisions against the graphs the stand-in backend replayed (counted by
    # the key SGLang handed it): a step decided as one mode that replays another mode's graph
    # fails here, whatever the plugin's step counters say
    decided = {m: run.series("decisions").get(("decode", m), 0) for m in run.modes}
    assert decided == by_mode, f"decisions {decided} != replays {by_mode}"
    assert decode == by_mode, (decode, by_mode)  # every counted replay is a step of that mode
    assert not any(k[0] == "decode" and k[2] == "eager" for k in steps), steps
    assert run.series("eager_fallbacks") == {}, run.series("eager_fallbacks")
    print(f"{run.name}: steps {sorted(steps.items())}; "  # shown by pytest -rP
          f"decisions {sorted(run.series('decisions').items())}; "
          f"explored {sorted(run.series('explored_steps').items())}")


def test_the_selectors_table_holds_replay_times(run: SelectorRun) -> None:
    decode_rows = {r["mode"] for r in run.table["rows"] if r["phase"] == "decode"}
    assert decode_rows >= set(run.modes), run.table["rows"]
    decisions = run.series("decisions")
    assert sum(n for (phase, _), n in decisions.items() if phase == "decode") >= 30, decisions


def test_both_tp_ranks_log_the_identical_decision_sequence(run: SelectorRun) -> None:
    seqs: dict[str, list[str]] = {}
    for rank, decision in DECISION.findall(run.log):
        seqs.setdefault(rank, []).append(decision)
    assert set(seqs) == {"TP0", "TP1"} and len(seqs["TP0"]) >= 3, seqs
    assert seqs["TP0"] == seqs["TP1"]


CAPTURE_RUNS = 3  # forwards per captured shape: the stand-in backend's 2 warm-ups + recording


def test_sbo_runs_in_sbo_steps_only(run: SelectorRun) -> None:
    """SBO's two overlaps (the shared expert in the dispatch hook; the signal down GEMM with the
    signal-checking combine) ran in every MoE call of a step in SBO, captures included, and in
    no call of a step in another mode."""
    if "sbo" not in run.modes or not CONFIGS[run.name].deepep:
        pytest.skip("SBO's calls are counted by the deep_ep stand-in")
    calls = run.counters[0]["deep_ep"]
    assert calls == run.counters[1]["deep_ep"], run.counters
    sbo_steps = sum(n for (_, mode, _), n in run.series("steps").items() if mode == "sbo")
    sbo_shapes = sum(n for k, n in run.counters[0]["captures"].items() if "'overlap:sbo'" in k)
    want = MOE_LAYERS * (sbo_steps + CAPTURE_RUNS * sbo_shapes)
    assert sbo_steps > 0 and sbo_shapes > 0, (run.series("steps"), run.counters[0]["captures"])
    assert calls["dispatch_hooks"] == calls["combine_overlap_per_expert"] == want, (calls, want)
    assert calls["dispatch"] > want, calls  # the other modes' MoE calls ran neither


def test_prefill_runs_deepep_normal_mode_where_deepep_mode_is_auto(run: SelectorRun) -> None:
    """`--deepep-mode auto` (as configs/h200-single-deepseek-v3.toml): the prefills through
    SGLang's normal-mode dispatcher (the stand-in's normal dispatch/combine, on both ranks,
    every MoE layer), decode through low-latency; the fp8 experts ran on both. The servers in
    low-latency mode make no normal call."""
    flags = CONFIGS[run.name].flags
    if not CONFIGS[run.name].deepep:
        pytest.skip("DeepEP's calls are counted by the deep_ep stand-in")
    calls = run.counters[0]["deep_ep"]
    assert calls == run.counters[1]["deep_ep"], run.counters
    auto = flags[flags.index("--deepep-mode") + 1] == "auto"
    normal = calls.get("normal_dispatch", 0)
    assert normal == calls.get("normal_combine", 0), calls
    assert (normal > 0) == auto and normal % MOE_LAYERS == 0, calls
    assert calls["dispatch"] > 0, calls  # decode: low-latency
    if "SGLANG_CPU_SHIM_DEEPEP_FP8" in CONFIGS[run.name].env:
        assert calls["fp8_experts"] == calls["dispatch"] + normal, calls


BASELINE = "plain_without_plugin"


def test_reliability_probes_answer_as_without_the_plugin(
        run: SelectorRun, overlap_runs: OverlapRuns, graph_runs: GraphRuns) -> None:
    """As the server without the plugin; on fp8 experts (other numerics) as the plugin's fp8
    server without overlap."""
    baseline = CONFIGS[run.name].baseline
    if baseline == "a2a":
        want, want_log = overlap_runs[BASELINE].probes, overlap_runs[BASELINE].log
    else:
        want, want_log = graph_runs[baseline].probes, graph_runs[baseline].probe_log
    assert want is not None
    assert_answers_as(run.probes, run.probe_log, want, want_log)
