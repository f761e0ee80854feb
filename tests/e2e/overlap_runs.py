"""The server configurations the overlap and reliability tests compare, each started once per
test session (tiny random DeepSeek-V3, CPU; each start costs ~1 min here). A server is started
on first use, or by `OverlapRuns.ensure` with the next ones loading while it answers.

Every server answers the same fixed prompts (test_overlap_servers.py compares those tokens). The
servers of PROBED - the one without the plugin and the three overlap modes - then also answer
everything in probes.py (test_reliability.py compares those outcomes), and last the request that
ends every SGLang 0.5.23 CPU server (probes.ENDING_CASE).
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import probes
from servers import Server, one_after_another

LONG = " ".join(f"The quick brown fox {i} jumps over the lazy dog {i * 7 % 10}." for i in range(40))
BATCH = ["Hello world! What is the capital of France?", "User: hi there.", "1 + 2 = 3, 4 + 5 =",
         "Paris is the capital of", "the and of to in is that for it", "Assistant: hello, how"]
NEW_TOKENS = 12

# float32: in bf16, a different (but equally valid) summation order flips greedy choices where
# the top two logits are within rounding (seen: gaps <= 0.004); in float32 they do not.
TP2 = ["--tp", "2", "--dtype", "float32"]
A2A = [*TP2, "--moe-a2a-backend", "torch_a2a"]
WITHOUT_PLUGIN = {"SGLANG_PLUGINS": "cpu_shim"}  # SGLang's whitelist: the kit's shim only
CONFIGS: dict[str, tuple[list[str], dict[str, str]]] = {
    "single_rank": (["--tp", "1", "--dtype", "float32"], {}),
    "plain_without_plugin": (TP2, WITHOUT_PLUGIN),
    "plain_with_plugin": (TP2, {}),
    "a2a": (A2A, {}),
    "tbo": ([*A2A, "--enable-two-batch-overlap"], {}),
    "sbo": ([*A2A, "--enable-single-batch-overlap"], {}),
    "auto": ([*A2A, "--enable-two-batch-overlap", "--enable-single-batch-overlap",
              "--overlap-gating", "auto", "--overlap-hardware-profile", "H20",
              "--enable-metrics", "--enable-metrics-for-all-schedulers"], {}),
}
METRICS_SCRAPED = ("auto",)  # test_metrics.py: /metrics before and after the fixed prompts
PROBED = ("plain_without_plugin", "tbo", "sbo", "auto")
PORT = 30200


@dataclass(frozen=True)
class Probes:
    cases: dict[str, probes.Outcome]
    streams: dict[int, probes.Outcome]
    """probes.streams_with_half_dropped: 30 at once, every other one dropped by the client."""
    after: probes.Outcome
    """The 1-2-3-token batch again, after the dropped streams."""
    ending: probes.Outcome
    """probes.ENDING_CASE, sent last."""


def assert_answers_as(got: Probes, got_log: str, want: Probes, want_log: str) -> None:
    """`got` answered the probes as `want` did: every case, the streams the client kept (the
    dropped ones: 200), the batch after them, the ending case's status; and its log has no
    traceback `want_log` lacks."""
    for case, outcome in want.cases.items():
        assert got.cases[case] == outcome, f"{case=}\n{got.cases[case]=}\n{outcome=}"
    for i, (w, g) in enumerate(zip(want.streams.values(), got.streams.values(), strict=True)):
        if i % 2:  # dropped by the client after its first event
            assert g.status == w.status == 200, f"stream {i}: {g=} {w=}"
        else:
            assert g == w, f"stream {i}:\n{g=}\n{w=}"
    assert got.after == want.after
    assert got.ending.status == want.ending.status
    extra = probes.tracebacks(got_log) - probes.tracebacks(want_log)
    assert not extra, sorted(extra)


@dataclass(frozen=True)
class Metrics:
    before: str
    """GET /metrics once the server is healthy, before the fixed prompts."""
    after: str
    """GET /metrics after them, once the plugin's gate counters caught up (or 60 s passed)."""
    gate: dict[str, Any]
    """The gate's learned table from GET /server_info, read right after `after`."""


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as r:
        return str(r.read().decode())


def _gate_table(url: str) -> dict[str, Any]:
    states = json.loads(get(f"{url}/server_info")).get("internal_states") or [{}]
    table: dict[str, Any] = states[0].get("sglang_overlap_gate", {})
    return table


def _decisions_of_rank0(text: str) -> int:
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("sglang_overlap_gate_decisions_total{")
               and 'tp_rank="0"' in line)


def _settled_metrics(url: str, before: str) -> Metrics:
    """SGLang writes its series (and the plugin its own) at each log of scheduler stats; the
    last one after traffic comes when the scheduler goes idle."""
    deadline = time.monotonic() + 60
    while True:
        gate, after = _gate_table(url), get(f"{url}/metrics")
        if (_decisions_of_rank0(after) == sum(gate.get("chosen", {}).values())
                or time.monotonic() > deadline):
            return Metrics(before, after, gate)
        time.sleep(2.0)


@dataclass(frozen=True)
class Run:
    ids: list[list[int]]
    """Greedy token ids of [LONG, *BATCH] (LONG alone, then BATCH as one request)."""
    log: str
    """The server's log, up to (not including) the ending case."""
    probes: Probes | None
    metrics: Metrics | None = None


def _probe(server: Server) -> tuple[Probes, str]:
    cases = probes.run_cases(server.port)
    streams = probes.streams_with_half_dropped(server.port)
    after = probes.post(server.port, probes.CASES["batch_of_1_2_3_tokens"])
    log = server.log_text()
    ending = probes.post(server.port, probes.ENDING_CASE)
    if ending.status is None:
        server.kill()
    return Probes(cases, streams, after, ending), log


class OverlapRuns:
    """name -> Run, each configuration's server started on first use."""

    def __init__(self, model: Path, env: dict[str, str], log_dir: Path) -> None:
        self.model, self.env, self.log_dir = model, env, log_dir
        self._runs: dict[str, Run] = {}

    def __getitem__(self, name: str) -> Run:
        self.ensure([name])
        return self._runs[name]

    def ensure(self, names: list[str]) -> None:
        """Run each of `names` not run yet, in order, the next ones loading while one answers
        (their answers are compared, not timed)."""
        missing = [self._server(name) for name in dict.fromkeys(names) if name not in self._runs]
        for server in one_after_another(missing):
            self._runs[server.name] = self._answer(server)

    def _server(self, name: str) -> Server:
        flags, env = CONFIGS[name]
        return Server(name, self.model, PORT + list(CONFIGS).index(name), flags,
                      {**self.env, **env}, self.log_dir)

    def _answer(self, server: Server) -> Run:
        name = server.name
        before = get(f"{server.url}/metrics") if name in METRICS_SCRAPED else ""
        ids = server.generate([LONG], NEW_TOKENS) + server.generate(BATCH, NEW_TOKENS)
        metrics = _settled_metrics(server.url, before) if name in METRICS_SCRAPED else None
        found, log = _probe(server) if name in PROBED else (None, server.log_text())
        return Run(ids, log, found, metrics)
