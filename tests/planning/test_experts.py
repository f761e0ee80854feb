"""Tests for planning/cost/experts.py: experts per GPU with redundant experts, SGLang's refusal,
and what the cost model makes of them. SGLang's own arithmetic: test_experts_sglang.py."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_overlap.planning.cost.cost_model import _sbo_units, predict
from sglang_overlap.planning.cost.experts import (
    ExpertLayout,
    ExpertLayoutError,
    check_eplb,
    check_expert_layout,
    idle_replicas_note,
    layout_of,
    redundant_to_fit,
    replicas_dispatched,
)
from sglang_overlap.planning.cost.profiles import (
    Deployment,
    ProfileError,
    deployment_for_server,
    load_hardware,
    load_model,
)
from sglang_overlap.planning.cost.stage_costs import MicroBatch, _traffic, stage_costs

DSV3 = load_model("deepseek-v3")
H100 = load_hardware("H100")


# (routed, redundant, ep) -> experts per GPU, worked by hand
@pytest.mark.parametrize(("routed", "redundant", "ep", "per_gpu"), [
    (256, 32, 72, 4),  # LMSYS's DeepSeek-V3 decode on 9 x 8 H100: 288 = 72 x 4
    (256, 0, 32, 8),
    (256, 0, 16, 16),
    (256, 0, 1, 256),
    (256, 32, 1, 288),
    (256, 32, 8, 36),
    (256, 256, 512, 1),
    (128, 16, 48, 3),
])
def test_experts_per_gpu(routed: int, redundant: int, ep: int, per_gpu: int) -> None:
    layout = check_expert_layout(routed, redundant, ep)
    assert (layout.physical, layout.per_rank) == (routed + redundant, per_gpu), (
        f"{routed=} {redundant=} {ep=}")


# (routed, redundant, ep) -> the refusal, worked by hand
@pytest.mark.parametrize(("routed", "redundant", "ep", "message"), [
    (256, 0, 72, "--ep-size 72 must divide the 256 routed + 0 redundant experts of deepseek-v3 "
     "(--ep-num-redundant-experts 0); --ep-num-redundant-experts 32 would make 288 = 72 GPUs x "
     "4 experts"),
    (256, 16, 72, "--ep-size 72 must divide the 256 routed + 16 redundant experts of deepseek-v3 "
     "(--ep-num-redundant-experts 16); --ep-num-redundant-experts 32 would make 288 = 72 GPUs x "
     "4 experts"),
    (256, 40, 72, "--ep-num-redundant-experts 32 would make 288 = 72 GPUs x 4 experts"),
    (256, 70, 72, "--ep-num-redundant-experts 104 would make 360 = 72 GPUs x 5 experts"),
    (256, 0, 7, "--ep-num-redundant-experts 3 would make 259 = 7 GPUs x 37 experts"),
    (256, 0, 384, "--ep-num-redundant-experts 128 would make 384 = 384 GPUs x 1 experts"),
    (256, -1, 16, "--ep-num-redundant-experts must be >= 0 (got -1)"),
    (256, 0, 0, "--ep-size must be >= 1 (got 0)"),
])
def test_refusals_name_the_flag_and_what_would_work(routed: int, redundant: int, ep: int,
                                                    message: str) -> None:
    with pytest.raises(ExpertLayoutError) as err:
        check_expert_layout(routed, redundant, ep, model="deepseek-v3")
    assert message in str(err.value), str(err.value)
    assert isinstance(err.value, ProfileError)  # plan's and check's error paths catch it


def test_the_model_is_named_only_when_known() -> None:
    with pytest.raises(ExpertLayoutError, match=r"experts \(--ep-num"):
        check_expert_layout(256, 0, 72)


@pytest.mark.parametrize(("near", "fit"), [(0, 32), (32, 32), (67, 32), (68, 32), (69, 104),
                                           (104, 104), (140, 104), (141, 176)])
def test_redundant_to_fit_ties_go_to_the_smaller(near: int, fit: int) -> None:
    """EP72 over 256 routed: 32, 104, 176 ... divide; 68 is 36 from both 32 and 104."""
    assert redundant_to_fit(256, 72, near) == fit, f"{near=}"


def reference_fit(routed: int, ep: int, near: int) -> int:
    """Brute force: the count nearest `near` (smaller on a tie) that divides."""
    fits = [r for r in range(0, near + 2 * ep + 1) if (routed + r) % ep == 0]
    return min(fits, key=lambda r: (abs(r - near), r))


@given(st.integers(1, 512), st.integers(1, 300), st.integers(0, 600))
def test_redundant_to_fit_is_the_nearest_that_divides(routed: int, ep: int, near: int) -> None:
    fit = redundant_to_fit(routed, ep, near)
    assert fit == reference_fit(routed, ep, near), f"{routed=} {ep=} {near=} {fit=}"


@given(st.integers(2, 512), st.integers(0, 100), st.integers(1, 300))
def test_accepted_exactly_when_routed_plus_redundant_divides(routed: int, redundant: int,
                                                             ep: int) -> None:
    if (routed + redundant) % ep:
        with pytest.raises(ExpertLayoutError, match=f"--ep-size {ep} must divide"):
            check_expert_layout(routed, redundant, ep)
    else:
        layout = check_expert_layout(routed, redundant, ep)
        assert layout.per_rank * ep == routed + redundant


# SGLang 0.5.23's handle_eplb_and_dispatch: the dispatch to the copies is on when
# --ep-dispatch-algorithm is given, or --enable-eplb, or a non-trivial --init-expert-location
@pytest.mark.parametrize(("eplb", "location", "algorithm", "used"), [
    (False, "trivial", None, False),
    (True, "trivial", None, True),
    (False, "/models/logical_count.json", None, True),
    (False, "trivial", "dynamic", True),
    (False, "trivial", "static", True),
    (True, "placement.pt", "lp", True),
])
def test_which_flags_send_tokens_to_the_copies(eplb: bool, location: str, algorithm: str | None,
                                               used: bool) -> None:
    assert replicas_dispatched(enable_eplb=eplb, init_expert_location=location,
                               ep_dispatch_algorithm=algorithm) is used


def test_enable_eplb_needs_expert_parallelism() -> None:
    with pytest.raises(ExpertLayoutError, match=r"^--enable-eplb needs --ep-size > 1 \(got 1\)$"):
        check_eplb(True, 1)
    check_eplb(True, 2)
    check_eplb(False, 1)


def test_rows_per_expert_with_and_without_the_copies() -> None:
    """Every rank sends 128 tokens x top-8 = 1024 rows. Spread over all 288 slots of EP72, each
    of the busiest rank's 4 experts gets 1024 x 72 / 288 = 256 rows; with the copies idle, the
    256 routed slots get 1024 x 72 / 256 = 288 rows each, and a rank of 4 of them 1152 rows."""
    used = check_expert_layout(256, 32, 72)
    idle = dataclasses.replace(used, replicas_used=False)
    assert used.rows_per_expert(128, 8) == 256.0 and used.receiving == 288
    assert idle.rows_per_expert(128, 8) == 288.0 and idle.receiving == 256
    assert ExpertLayout(256, 0, 64).rows_per_expert(128, 8) == 256.0  # 4 per GPU as well


def test_idle_replicas_note() -> None:
    assert idle_replicas_note(ExpertLayout(256, 32, 72, replicas_used=False)) == (
        "the 32 redundant experts get no tokens: with --init-expert-location trivial, no "
        "--enable-eplb and no --ep-dispatch-algorithm, SGLang routes each token to its logical "
        "expert's own slot")
    assert idle_replicas_note(ExpertLayout(256, 32, 72)) == ""
    assert idle_replicas_note(ExpertLayout(256, 0, 64, replicas_used=False)) == ""


def test_deployment_carries_the_redundant_experts() -> None:
    with pytest.raises(ProfileError, match="--ep-num-redundant-experts -3"):
        Deployment(num_redundant_experts=-3)
    deploy = deployment_for_server(ep_size=72, tp_size=72, nnodes=9, attn_dp_size=72,
                                   num_redundant_experts=32, redundant_experts_used=False)
    assert layout_of(DSV3, deploy) == ExpertLayout(256, 32, 72, replicas_used=False)
    assert layout_of(DSV3, Deployment(ep_size=32)) == ExpertLayout(256, 0, 32)


EP72 = Deployment(ep_size=72, num_redundant_experts=32, tokens_per_gpu=128)


def test_the_cost_model_prices_four_experts_per_gpu() -> None:
    """EP72 + 32 redundant: four grouped-GEMM groups of 256 rows per rank (the weights of four
    experts), not the three of 256 // 72."""
    mb = MicroBatch((1,) * 128, (4096,) * 128, 128.0, False)
    ours = stage_costs(DSV3, H100, EP72, mb)
    # the same GEMMs as EP64 without redundancy: 4 experts per rank, 128 x 8 x 64 / 256 = 256
    # rows each
    ep64 = stage_costs(DSV3, H100, Deployment(ep_size=64, tokens_per_gpu=128), mb)
    assert ours.gate_up == pytest.approx(ep64.gate_up) and ours.down == pytest.approx(ep64.down)
    three = stage_costs(DSV3, H100, dataclasses.replace(EP72, num_redundant_experts=0), mb)
    assert ours.gate_up > three.gate_up and ours.down > three.down  # a fourth expert's weights


def test_idle_copies_cost_the_busiest_rank_more_rows() -> None:
    mb = MicroBatch((1,) * 128, (4096,) * 128, 128.0, False)
    used = stage_costs(DSV3, H100, EP72, mb)
    idle = stage_costs(DSV3, H100, dataclasses.replace(EP72, redundant_experts_used=False), mb)
    assert idle.act > used.act and idle.dispatch_recv > used.dispatch_recv
    assert idle.down >= used.down
    slow = predict(DSV3, H100, dataclasses.replace(EP72, redundant_experts_used=False))
    fast = predict(DSV3, H100, EP72)
    assert slow.estimates["none"].step_us > fast.estimates["none"].step_us


def test_normal_mode_fan_out_counts_the_copies() -> None:
    """Prefill's normal-mode dispatch sends one copy per destination rank: a token's top-8
    among 288 slots, 4 per rank, reaches 72 x (1 - C(284, 8) / C(288, 8)) ranks."""
    from math import comb

    deploy = dataclasses.replace(EP72, phase="prefill")
    local, remote = _traffic(DSV3, deploy, 1.0, 1.0, low_latency=False)
    assert local == pytest.approx(72 * (1 - comb(284, 8) / comb(288, 8)))
    nodes = 9 * (1 - comb(256, 8) / comb(288, 8))  # 9 nodes of 8 GPUs x 4 = 32 slots
    assert remote == pytest.approx(nodes * 64 / 72)


def test_sbo_signals_follow_the_experts_per_gpu() -> None:
    four = _sbo_units(DSV3, H100, EP72, 128.0)
    three = _sbo_units(DSV3, H100, dataclasses.replace(EP72, num_redundant_experts=0), 128.0)
    assert four > three, (four, three)


def test_lmsys_ep72_decode_row() -> None:
    """docs/planning.md's decode row: LMSYS served 22.3k output tok/s per node on 9 x 8 H100
    (EP72 with 32 redundant experts, 2K input, 256 sequences per GPU); the model, not refitted
    on decode, says 28.6k with TBO (+28%)."""
    deploy = Deployment(ep_size=72, num_redundant_experts=32, tokens_per_gpu=256,
                        context_len=2048)
    per_node = predict(DSV3, H100, deploy).estimates["tbo"].throughput_per_gpu * 8
    assert 28_550 <= per_node <= 28_650, per_node
    assert 0.27 <= per_node / 22_300 - 1 <= 0.29
