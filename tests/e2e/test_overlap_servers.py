"""The three overlap modes inside real SGLang servers (tiny random DeepSeek-V3, --tp 2, CPU).

For a fixed set of prompts - one long prompt alone (a prefill batch of one request: TBO must cut
it in two chunks) and a batch of six (a balanced prefill split, then decode steps split in half)
- greedy outputs with TBO + two-chunk, SBO and automatic gating equal, token for token, those of
the same server without overlap (`--moe-a2a-backend torch_a2a`, which puts --ep 2 over the two
ranks). Every overlap server must show in its own log that the plugin's path ran.
"""

from __future__ import annotations

import re

import pytest
from overlap_runs import OverlapRuns

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def runs(overlap_runs: OverlapRuns) -> dict[str, tuple[list[list[int]], str]]:
    """name -> (token ids of [LONG, *BATCH], the server's log)."""
    names = ["single_rank", "plain_without_plugin", "plain_with_plugin", "a2a", "tbo", "sbo",
             "auto"]
    overlap_runs.ensure(names)  # those not run yet: each loads while the one before answers
    return {name: (overlap_runs[name].ids, overlap_runs[name].log) for name in names}


def _stats(log: str) -> set[str]:
    return set(re.findall(r"\(first (\w+)\)", log))


def test_plugin_without_flags_is_invisible(runs) -> None:
    assert runs["plain_with_plugin"][0] == runs["plain_without_plugin"][0]
    assert "sglang-overlap stats" not in runs["plain_with_plugin"][1]
    assert "sglang-overlap stats" not in runs["plain_without_plugin"][1]


@pytest.mark.parametrize("mode", ["tbo", "sbo", "auto"])
def test_overlap_outputs_equal_the_server_without_overlap(runs, mode: str) -> None:
    baseline, got = runs["a2a"][0], runs[mode][0]
    for i, (want, have) in enumerate(zip(baseline, got, strict=True)):
        assert have == want, f"{mode=} prompt {i}: {have=} {want=}"


def test_torch_a2a_matches_plain_tensor_parallel_and_a_single_rank(runs) -> None:
    # Same experts, other arithmetic order (all-to-all + per-expert GEMMs instead of a TP
    # all-reduce of sharded experts; one rank computing everything): equal in float32.
    assert runs["a2a"][0] == runs["plain_with_plugin"][0]
    assert runs["a2a"][0] == runs["single_rank"][0]


def test_tbo_and_two_chunk_paths_ran(runs) -> None:
    seen = _stats(runs["tbo"][1])
    assert {"tbo", "two_chunk", "tbo_executor"} <= seen, seen
    assert "sglang-overlap stats" not in runs["a2a"][1]


def test_sbo_path_ran(runs) -> None:
    assert "sbo_down_gemm_signal" in _stats(runs["sbo"][1])


def test_auto_gating_decides_identically_on_every_rank(runs) -> None:
    log = runs["auto"][1]
    per_rank: dict[str, list[str]] = {}
    for rank, decision in re.findall(r"(TP\d) EP\d\] sglang-overlap gate: (\w+ -> \w+)", log):
        per_rank.setdefault(rank, []).append(decision)
    assert set(per_rank) == {"TP0", "TP1"}, per_rank
    assert per_rank["TP0"] == per_rank["TP1"]
    assert any(k.startswith("gate_") for k in _stats(log))
