"""SGLang's GPU decode path (its `DecodeCudaGraphRunner`: capture loop, `can_run_graph`, padding
to a captured size, the TBO plugin's replay preparation) in real `--tp 2` CPU servers, through
the kit's stand-in graph backend: greedy tokens equal the eager server's (`--moe-a2a-backend
torch_a2a`, no overlap), and the counters show the decode steps replayed captured graphs. The
`deepep_*` servers run `--moe-a2a-backend deepep` through SGLang's own DeepEP dispatcher on
the kit's deep_ep / deep_gemm stand-ins (tests/kit/standins): plain, with TBO (upstream's
overlapped executor on two inner DeepEP dispatchers), with SBO without the down-GEMM/combine
overlap (the shared expert in the dispatch hook), and with full SBO on fp8 experts in both
combine forms (per expert, per block): the shared expert in the dispatch hook, the plugin's
signal down GEMM, the combine send on SGLang's combine stream checking every signal; those give
the tokens of the fp8 server without overlap. The `deepep_graphs_auto*` servers run
`--deepep-mode auto` (alone and with TBO): every prefill through SGLang's normal-mode
dispatcher (`_DeepEPDispatcherImplNormal`, the stand-in's normal layout/dispatch/combine),
decode through low-latency in the graphs. The stand-ins' call counters show what ran. The
DeepEP TBO and SBO servers answer test_reliability.py's probes as their baselines do.
"""

from __future__ import annotations

import pytest
from graph_runs import CONFIGS, GraphRuns
from overlap_runs import OverlapRuns, assert_answers_as

pytestmark = pytest.mark.e2e

BASELINE = "plain_without_plugin"
GRAPH_SERVERS = list(CONFIGS)
DEEPEP_SERVERS = [name for name, c in CONFIGS.items() if c.deepep_form is not None]
TBO_SERVERS = ("deepep_graphs_tbo", "deepep_graphs_auto_tbo")
# --deepep-mode auto: prefill through DeepEP's normal mode, decode through low-latency
AUTO_SERVERS = ("deepep_graphs_auto", "deepep_graphs_auto_tbo")
MOE_LAYERS = 2  # tests/kit/make_tiny_dsv3.py: three layers, the first dense
SBO_SIGNAL_SERVERS = {"deepep_graphs_sbo_expert": "per_expert",
                      "deepep_graphs_sbo_block": "per_block"}


@pytest.mark.parametrize("name", [n for n in GRAPH_SERVERS if CONFIGS[n].baseline])
def test_replayed_decode_gives_the_eager_tokens(graph_runs: GraphRuns,
                                                overlap_runs: OverlapRuns, name: str) -> None:
    baseline = CONFIGS[name].baseline
    want = overlap_runs["a2a"].ids if baseline == "a2a" else graph_runs[baseline].ids
    have = graph_runs[name].ids
    for i, (w, h) in enumerate(zip(want, have, strict=True)):
        assert h == w, f"{name} prompt {i}: {h=} {w=}"


@pytest.mark.parametrize("name", GRAPH_SERVERS)
def test_decode_steps_replayed_on_both_ranks(graph_runs: GraphRuns, name: str) -> None:
    ranks = graph_runs[name].by_rank()
    assert set(ranks) == {0, 1}, ranks
    assert ranks[0]["captures"] == ranks[1]["captures"], ranks
    assert ranks[0]["replays"] == ranks[1]["replays"], ranks  # every step ran on both ranks
    # the batch of six pads to the graph of 8 for its 11 decode steps (12 tokens: 1 prefilled)
    assert ranks[0]["replays"].get("bs8", 0) >= 11, ranks[0]
    assert all(n == 1 for n in ranks[0]["captures"].values()), ranks[0]


@pytest.mark.parametrize("name", ["graphs_tbo", *TBO_SERVERS])
def test_tbo_captures_the_batch_sizes_it_can_split(graph_runs: GraphRuns, name: str) -> None:
    # TBO needs two halves: upstream's capture list drops the sizes it cannot split
    captured = set(graph_runs[name].by_rank()[0]["captures"])
    assert {"bs4", "bs8"} <= captured, captured
    assert "sglang-overlap stats" in graph_runs[name].log



@pytest.mark.parametrize("name", TBO_SERVERS)
def test_tbo_on_the_deepep_path_runs_upstreams_overlapped_executor(graph_runs: GraphRuns,
                                                                   name: str) -> None:
    # counted by the plugin's hook around `operations.execute_overlapped_operations`
    assert "(first tbo_executor)" in graph_runs[name].log


def test_without_tbo_the_deepep_path_runs_no_overlapped_executor(graph_runs: GraphRuns) -> None:
    assert "(first tbo_executor)" not in graph_runs["deepep_graphs"].log


@pytest.mark.parametrize("name", DEEPEP_SERVERS)
def test_deepep_servers_dispatch_through_the_stand_in(graph_runs: GraphRuns, name: str) -> None:
    ranks = graph_runs[name].by_rank()
    calls = {rank: c["deep_ep"] for rank, c in ranks.items()}
    assert calls[0] == calls[1], calls  # DeepEP's calls pair up across ranks
    n = calls[0]["dispatch"]  # low-latency
    assert n == calls[0]["combine"] > 0, calls
    # normal dispatch/combine: prefill of the auto servers; the rest prefill in low-latency
    normal = calls[0].get("normal_dispatch", 0)
    assert normal == calls[0].get("normal_combine", 0), calls
    assert (normal > 0) == (name in AUTO_SERVERS), calls
    # SGLang's SBO (SM90) runs the shared expert in the dispatch hook, on every dispatch;
    # without SBO no dispatch hook is registered
    sbo = name == "deepep_graphs_sbo_shared" or name in SBO_SIGNAL_SERVERS
    assert calls[0].get("dispatch_hooks", 0) == (n if sbo else 0), calls
    fp8 = "SGLANG_CPU_SHIM_DEEPEP_FP8" in CONFIGS[name].env
    assert calls[0].get("fp8_experts", 0) == (n + normal if fp8 else 0), calls
    # the signal combine (every signal checked raised) on every MoE call of a full-SBO server,
    # in the installed tree's form, and nowhere else
    overlapped = {k: v for k, v in calls[0].items() if k.startswith("combine_overlap")}
    form = SBO_SIGNAL_SERVERS.get(name)
    assert overlapped == ({f"combine_overlap_{form}": n} if form else {}), calls
    # on SGLang's side stream: the shared expert without SBO, the combine send with full SBO
    # (SBO without the down-GEMM overlap runs both on the main stream; TBO's operations run the
    # shared expert on the main stream, only steps SGLang does not split use the side stream)
    side = calls[0].get("side_stream_enters", 0)
    if name == "deepep_graphs_tbo":
        assert 0 < side < n, calls
    elif name == "deepep_graphs_auto_tbo":  # every step splits (prefill: the two-chunk split)
        assert side == 0, calls
    else:
        assert side == (0 if name == "deepep_graphs_sbo_shared" else n + normal), calls


@pytest.mark.parametrize("name", AUTO_SERVERS)
def test_auto_servers_prefill_in_normal_mode(graph_runs: GraphRuns, name: str) -> None:
    # `--deepep-mode auto` resolves to normal for every extend batch (each logged "Prefill
    # batch" on TP0) and to low-latency for decode, which the graphs replay: one normal
    # dispatch per MoE layer per prefill, per micro-batch with TBO (upstream's prefill
    # operations on two micro-batches: two requests split, or one request's two chunks)
    run = graph_runs[name]
    calls = run.by_rank()[0]["deep_ep"]
    prefills = run.log.count("] Prefill batch")
    micro_batches = 2 if name in TBO_SERVERS else 1
    assert prefills > 0 and calls["normal_dispatch"] == MOE_LAYERS * prefills * micro_batches, (
        prefills, calls)
    assert ("(first two_chunk)" in run.log) == (name in TBO_SERVERS)


@pytest.mark.parametrize("name", [n for n, c in CONFIGS.items() if c.probed and c.baseline])
def test_reliability_probes_answer_as_the_baseline(graph_runs: GraphRuns,
                                                   overlap_runs: OverlapRuns, name: str) -> None:
    """test_reliability.py's probes on the DeepEP overlap servers: answered as the server without
    the plugin does, or (fp8 experts: other numerics) as the fp8 server without overlap."""
    got, baseline = graph_runs[name], CONFIGS[name].baseline
    if baseline == "a2a":
        want, want_log = overlap_runs[BASELINE].probes, overlap_runs[BASELINE].log
    else:
        assert baseline is not None
        want, want_log = graph_runs[baseline].probes, graph_runs[baseline].probe_log
    assert got.probes is not None and want is not None
    assert_answers_as(got.probes, got.probe_log, want, want_log)
