"""SGLang's GPU decode path (its `DecodeCudaGraphRunner`: capture loop, `can_run_graph`, padding
to a captured size, the TBO plugin's replay preparation) in real `--tp 2` CPU servers, through
the kit's stand-in graph backend: greedy tokens equal the eager server's (`--moe-a2a-backend
torch_a2a`, no overlap), and the counters show the decode steps replayed captured graphs. The
`deepep_graphs` server runs `--moe-a2a-backend deepep` through SGLang's own DeepEP dispatcher on
the kit's deep_ep / deep_gemm stand-ins (tests/kit/standins).
"""

from __future__ import annotations

import pytest
from graph_runs import GraphRuns
from overlap_runs import OverlapRuns

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("name", ["graphs_tbo", "graphs_sbo", "deepep_graphs"])
def test_replayed_decode_gives_the_eager_tokens(graph_runs: GraphRuns,
                                                overlap_runs: OverlapRuns, name: str) -> None:
    want, have = overlap_runs["a2a"].ids, graph_runs[name].ids
    for i, (w, h) in enumerate(zip(want, have, strict=True)):
        assert h == w, f"{name} prompt {i}: {h=} {w=}"


@pytest.mark.parametrize("name", ["graphs_tbo", "graphs_sbo", "deepep_graphs"])
def test_decode_steps_replayed_on_both_ranks(graph_runs: GraphRuns, name: str) -> None:
    ranks = graph_runs[name].by_rank()
    assert set(ranks) == {0, 1}, ranks
    assert ranks[0]["captures"] == ranks[1]["captures"], ranks
    assert ranks[0]["replays"] == ranks[1]["replays"], ranks  # every step ran on both ranks
    # the batch of six pads to the graph of 8 for its 11 decode steps (12 tokens: 1 prefilled)
    assert ranks[0]["replays"].get("bs8", 0) >= 11, ranks[0]
    assert all(n == 1 for n in ranks[0]["captures"].values()), ranks[0]


def test_tbo_captures_the_batch_sizes_it_can_split(graph_runs: GraphRuns) -> None:
    # TBO needs two halves: upstream's capture list drops the sizes it cannot split
    captured = set(graph_runs["graphs_tbo"].by_rank()[0]["captures"])
    assert {"bs4", "bs8"} <= captured, captured
    assert "sglang-overlap stats" in graph_runs["graphs_tbo"].log
