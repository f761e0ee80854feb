"""The server configurations the overlap and reliability tests compare, each started once per
test session (tiny random DeepSeek-V3, CPU, one server at a time: each start costs ~1 min here).

Every server answers the same fixed prompts (test_overlap_servers.py compares those tokens). The
servers of PROBED - the one without the plugin and the three overlap modes - then also answer
everything in probes.py (test_reliability.py compares those outcomes), and last the request that
ends every SGLang 0.5.23 CPU server (probes.ENDING_CASE).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import probes
from servers import Server

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
              "--overlap-gating", "auto", "--overlap-hardware-profile", "H20"], {}),
}
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


@dataclass(frozen=True)
class Run:
    ids: list[list[int]]
    """Greedy token ids of [LONG, *BATCH] (LONG alone, then BATCH as one request)."""
    log: str
    """The server's log, up to (not including) the ending case."""
    probes: Probes | None


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
        if name not in self._runs:
            self._runs[name] = self._run(name)
        return self._runs[name]

    def _run(self, name: str) -> Run:
        flags, env = CONFIGS[name]
        server = Server(name, self.model, PORT + list(CONFIGS).index(name), flags,
                        {**self.env, **env}, self.log_dir)
        with server:
            ids = server.generate([LONG], NEW_TOKENS) + server.generate(BATCH, NEW_TOKENS)
            found, log = _probe(server) if name in PROBED else (None, server.log_text())
        return Run(ids, log, found)
