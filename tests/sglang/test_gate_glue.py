"""The gate's glue on the real SGLang 0.5.23 modules (CPU): how --overlap-hardware-profile is
resolved at start-up, launcher refusals, the hooked `_update_gather_batch`, the forward timer,
the learned table in the internal state, and the all-reduce that makes ranks decide alike (two
real gloo processes)."""

from __future__ import annotations

import inspect
import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import require_module

require_module("sglang.srt.managers.scheduler_components.dp_attn")

from sglang.srt.managers.scheduler_components import dp_attn as upstream_dp_attn  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

from sglang_overlap import stats  # noqa: E402
from sglang_overlap.modes import Mode, Phase, StepDecision  # noqa: E402
from sglang_overlap.planning.cost.prior import CostModelPrior, FlatPrior  # noqa: E402
from sglang_overlap.planning.cost.profiles import (  # noqa: E402
    Deployment,
    ProfileError,
    load_model,
)
from sglang_overlap.planning.selector import ModeSelector, SelectorConfig  # noqa: E402
from sglang_overlap.planning.step_table import cell_index, measure_bucket  # noqa: E402
from sglang_overlap.settings import OverlapSettings, SettingsError  # noqa: E402
from sglang_overlap.sglang import selector_setup, state  # noqa: E402
from sglang_overlap.sglang.selector_runtime import SelectorRuntime, SelectorShare  # noqa: E402
from sglang_overlap.sglang.upstream import (  # noqa: E402
    dp_attn,
    internal_state,
    model_runner,
    request_receiver,
)
from sglang_overlap.sglang.upstream.server_args import parse_server_args  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
AUTO = OverlapSettings(enable_two_batch_overlap=True, enable_single_batch_overlap=True,
                       requested_a2a_backend="torch_a2a", overlap_gating="auto")
DSV3 = load_model("deepseek-v3")


@pytest.fixture(scope="module", autouse=True)
def _plugins_loaded() -> None:
    from sglang.srt.plugins import load_plugins

    load_plugins()


@pytest.fixture()
def auto_settings():
    state.configure(AUTO)
    yield AUTO
    state.configure(None)
    selector_setup.set_runtime(None)


# -- --overlap-hardware-profile, resolved at start-up ---------------------------------------------

def test_auto_on_cpu_is_a_flat_prior_and_says_so() -> None:
    prior, how = selector_setup.resolve_prior(AUTO, DSV3, Deployment(), device="cpu",
                                              device_name=None)
    assert isinstance(prior, FlatPrior)
    assert "--overlap-hardware-profile auto on device 'cpu'" in how and "measurements" in how


def test_auto_on_a_known_gpu_is_its_cost_model() -> None:
    prior, how = selector_setup.resolve_prior(AUTO, DSV3, Deployment(), device="cuda",
                                    device_name="NVIDIA H200")
    assert isinstance(prior, CostModelPrior) and prior.hw.name == "H200" and "H200" in how


def test_auto_on_an_unknown_gpu_falls_back_deliberately() -> None:
    prior, how = selector_setup.resolve_prior(AUTO, DSV3, Deployment(), device="cuda",
                                    device_name="NVIDIA A100-SXM4-80GB")
    assert isinstance(prior, FlatPrior)
    assert "no shipped profile for 'NVIDIA A100-SXM4-80GB'" in how and "calibrate.py" in how


def test_named_and_bad_profiles(tmp_path: Path) -> None:
    s = OverlapSettings(**{**AUTO.to_dict(), "overlap_hardware_profile": "H20"})
    prior, _ = selector_setup.resolve_prior(s, DSV3, Deployment(), device="cpu", device_name=None)
    assert isinstance(prior, CostModelPrior) and prior.hw.name == "H20"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"base": "H20", "num_sms": "many"}))
    s = OverlapSettings(**{**AUTO.to_dict(), "overlap_hardware_profile": str(bad)})
    with pytest.raises(ProfileError, match=f"--overlap-hardware-profile {bad}: .*num_sms"):
        selector_setup.resolve_prior(s, DSV3, Deployment(), device="cpu", device_name=None)


# -- refusals in the launcher ------------------------------------------------------------------

TP2_AUTO = ["--tp", "2", "--moe-a2a-backend", "torch_a2a", "--enable-two-batch-overlap",
            "--overlap-gating", "auto"]


def _model_dir(tmp_path: Path, config: dict[str, Any]) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_unsupported_model_is_refused_at_start_up_naming_the_field(tmp_path: Path) -> None:
    """A config of a proven architecture (sglang_overlap/models.py) that the cost model cannot
    price: the missing field is named. (Another architecture is refused before, by the table.)"""
    no_experts = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
                  "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
                  "num_attention_heads": 4, "vocab_size": 100}
    path = _model_dir(tmp_path, no_experts)
    with pytest.raises(SettingsError, match="missing field 'n_routed_experts'") as info:
        parse_server_args(["--model-path", str(path), *TP2_AUTO])
    assert "--overlap-gating auto cannot model" in str(info.value)
    # without auto gating the same model is no business of the gate
    parse_server_args(["--model-path", str(path), *TP2_AUTO[:-2]])


@pytest.mark.parametrize(("text", "why"), [
    ("{not json", ".*/config.json is not JSON \\(Expecting property name"),
    ('["DeepseekV3ForCausalLM"]', ".*/config.json is not a JSON object \\(got list\\)"),
    ('{"architectures": "DeepseekV3ForCausalLM"}',
     '.*/config.json: "architectures" must be a list of class names')])
def test_a_broken_config_is_one_error_naming_model_path(tmp_path: Path, text: str,
                                                         why: str) -> None:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(text)
    with pytest.raises(SettingsError, match=f"^--model-path {d}: {why}"):
        parse_server_args(["--model-path", str(d), *TP2_AUTO])


def test_bad_hardware_profile_is_refused_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="--overlap-hardware-profile /nonexistent/x.json"):
        parse_server_args(["--model-path", "/nonexistent/m", *TP2_AUTO,
                           "--overlap-hardware-profile", "/nonexistent/x.json"])


# -- the hooks on the real modules ---------------------------------------------------------------

def test_gate_step_runs_inside_sglang() -> None:
    target = upstream_dp_attn._update_gather_batch
    hooks = [c.cell_contents for c in target.__closure__ or ()]
    assert dp_attn.select_step in hooks and inspect.unwrap(target) is not target


def test_model_runner_and_internal_state_hooks_are_installed() -> None:
    from sglang.srt.managers.scheduler_components.internal_state import (
        SchedulerInternalStateController,
    )
    from sglang.srt.model_executor.model_runner import ModelRunner

    for fn, ours in ((ModelRunner.forward, model_runner.timed_forward),
                     (ModelRunner.initialize, model_runner.start_selector),
                     (SchedulerInternalStateController.get_internal_state,
                      internal_state.add_gate_table)):
        hooks = [c.cell_contents for c in fn.__closure__ or ()]
        assert ours in hooks, f"{fn.__qualname__} runs {hooks}"


def _sync_info(mode: ForwardMode, tokens: int, tbo_split: int | None) -> Any:
    info = upstream_dp_attn.MLPSyncBatchInfo(
        num_dp_ranks=1, tp_size=2, cp_size=1, num_tokens=tokens, num_tokens_for_logprob=tokens,
        can_run_decode_cuda_graph=False, can_run_draft_cuda_graph=False,
        can_run_prefill_cuda_graph=False, is_extend_in_batch=mode.is_extend(),
        local_can_run_tbo=True, local_forward_mode=mode.value)
    info.finalize_local()
    info.tbo_split_seq_index = tbo_split
    info.global_forward_mode = mode.value if tbo_split is not None else None
    return info


def _runtime(prior: Any, **cfg: Any) -> SelectorRuntime:
    return SelectorRuntime(ModeSelector(prior, SelectorConfig(**cfg)), sync_steps=4, cuda=False,
                            setup="test")


def test_update_gather_batch_applies_the_gates_choice(auto_settings, caplog) -> None:
    # A prior that says TBO wins decode, none wins prefill: the hooked upstream function keeps
    # TBO's split for decode and clears it for prefill (and reads the phase from the gathered
    # forward modes when TBO cannot run, where global_forward_mode is None).
    class Prior:
        name, enabled = "test", frozenset({"tbo", "sbo"})

        def candidates(self, phase: str) -> tuple[str, ...]:
            return ("none", "tbo", "sbo") if phase == "decode" else ("none", "tbo")

        def predictions(self, phase: str, busiest: int, mean: float) -> dict[str, float]:
            return ({"none": 10.0, "tbo": 5.0, "sbo": 9.0} if phase == "decode"
                    else {"none": 10.0, "tbo": 20.0})

    rt = _runtime(Prior(), min_trials=0)
    selector_setup.set_runtime(rt)
    caplog.set_level(logging.INFO, logger="sglang_overlap")
    before = stats.snapshot()
    batch = SimpleNamespace()
    info = _sync_info(ForwardMode.DECODE, 8, tbo_split=4)
    upstream_dp_attn._update_gather_batch(batch, info, True)
    d = state.take_handed_over()
    assert batch.tbo_split_seq_index == 4 and d.mode == "tbo" and d.phase == "decode"
    assert d.cell == cell_index("decode", measure_bucket(8), "tbo") and d.source == "selector"
    assert state.take_handed_over() is None, "a decision is handed over once"
    info = _sync_info(ForwardMode.EXTEND, 300, tbo_split=1)
    upstream_dp_attn._update_gather_batch(batch, info, True)
    assert batch.tbo_split_seq_index is None and batch.global_forward_mode is None
    assert state.take_handed_over().mode == "none"
    info = _sync_info(ForwardMode.DECODE, 8, tbo_split=None)  # TBO cannot run: SBO next best
    upstream_dp_attn._update_gather_batch(batch, info, True)
    assert state.take_handed_over().mode == "sbo"
    upstream_dp_attn._update_gather_batch(batch, info, True)  # decided, its forward never ran
    upstream_dp_attn._update_gather_batch(batch, info, True, skip_global_metadata=True)
    assert state.take_handed_over() is None, "no metadata: undecided, not the stale decision"
    lines = [r.getMessage() for r in caplog.records if "sglang-overlap gate:" in r.getMessage()]
    assert [line.split(" (")[0] for line in lines] == [
        "sglang-overlap gate: decode -> tbo", "sglang-overlap gate: prefill -> none",
        "sglang-overlap gate: decode -> sbo"], lines
    assert "step 1 decode busiest=8" in lines[0]
    after = stats.snapshot()
    for series, want in (("decisions", {("decode", "tbo"): 1, ("prefill", "none"): 1,
                                        ("decode", "sbo"): 2}),
                         ("decision_changes", {("decode",): 2, ("prefill",): 1})):
        grown = {k: v - before[series].get(k, 0) for k, v in after[series].items()
                 if v != before[series].get(k, 0)}
        assert grown == want, series


def test_a_split_with_an_empty_micro_batch_is_not_a_tbo_candidate(auto_settings) -> None:
    # One decode sequence: SGLang can run TBO (split index 0), but one micro-batch is empty on
    # every rank, so it is the serial step plus overhead; the gate does not offer TBO there,
    # even with a prior that says TBO wins, and SGLang's split is cleared.
    class Prior:
        name, enabled = "test", frozenset({"tbo"})

        def candidates(self, phase: str) -> tuple[str, ...]:
            return ("none", "tbo")

        def predictions(self, phase: str, busiest: int, mean: float) -> dict[str, float]:
            return {"none": 10.0, "tbo": 5.0}

    rt = _runtime(Prior(), min_trials=0)
    selector_setup.set_runtime(rt)
    batch = SimpleNamespace()
    for mode, tokens, split, want in [(ForwardMode.DECODE, 1, 0, "none"),
                                      (ForwardMode.DECODE, 2, 1, "tbo"),
                                      (ForwardMode.EXTEND, 1, 0, "none"),
                                      (ForwardMode.EXTEND, 2, 1, "tbo")]:
        upstream_dp_attn._update_gather_batch(batch, _sync_info(mode, tokens, split), True)
        assert state.take_handed_over().mode == want, (mode, tokens)
        assert batch.tbo_split_seq_index == (split if want == "tbo" else None), (mode, tokens)
        d = rt.selector.decide("prefill" if mode.is_extend() else "decode", [tokens])
        assert d.mode == "tbo", "the gate alone, offered TBO, takes it"


def _fb(name: str, mode: ForwardMode = ForwardMode.DECODE, tbo: bool = False) -> Any:
    return SimpleNamespace(name=name, forward_mode=mode, can_run_tbo=tbo)


def test_forward_timer_records_only_gated_steps(auto_settings) -> None:
    rt = _runtime(FlatPrior(frozenset({"tbo"})))
    selector_setup.set_runtime(rt)
    runner = SimpleNamespace(is_draft_worker=False)
    calls, seen = [], []

    def forward(self: Any, batch: Any) -> str:
        calls.append(batch.name)
        seen.append(state.decision())
        return "out"

    assert model_runner.timed_forward(forward, runner, _fb("b0")) == "out"  # nothing decided
    assert rt.local.empty() and seen[-1].source == "upstream"
    d = rt.decide("decode", [8])
    state.hand_over(d)
    model_runner.timed_forward(forward, SimpleNamespace(is_draft_worker=True), _fb("draft"))
    assert rt.local.empty() and seen[-1] is None, "draft forwards are not the step"
    model_runner.timed_forward(forward, runner, _fb("b1"))
    assert seen[-1] is d and state.decision() is None, "the step runs its decision, then ends"
    cell = cell_index("decode", measure_bucket(8), "none")
    assert rt.local.empty(), "the first step of a (phase, mode) is dropped"
    state.hand_over(rt.decide("decode", [8]))
    model_runner.timed_forward(forward, runner, _fb("b2"))
    assert rt.local.count(cell) == 1 and calls == ["b0", "draft", "b1", "b2"]
    model_runner.timed_forward(forward, runner, _fb("b3"))
    assert rt.local.count(cell) == 1, "one decision, one timed forward"
    state.hand_over(rt.decide("decode", [100]))  # another bucket, same (phase, mode): timed
    model_runner.timed_forward(forward, runner, _fb("b4"))
    assert rt.local.count(cell_index("decode", measure_bucket(100), "none")) == 1


def test_a_decision_the_batch_contradicts_stops_the_step(auto_settings) -> None:
    """A TBO decision on a batch SGLang did not split (or the reverse) means the decision no
    longer reaches SGLang: refuse to run it rather than replay or count the wrong mode."""
    runner = SimpleNamespace(is_draft_worker=False)
    for mode, split in (("tbo", False), ("none", True), ("sbo", True)):
        state.hand_over(StepDecision(Mode(mode), Phase.DECODE, step=7))
        with pytest.raises(RuntimeError, match=f"step 7 was decided {mode} but SGLang"):
            model_runner.timed_forward(lambda *a: pytest.fail("ran"), runner,
                                       _fb("x", tbo=split))
        assert state.decision() is None


def test_every_served_step_is_counted_by_what_ran(auto_settings) -> None:
    runner = SimpleNamespace(is_draft_worker=False)

    def forward(self: Any, batch: Any) -> Any:
        return SimpleNamespace(can_run_graph=batch.name == "graph")

    def steps() -> dict[tuple[str, ...], int]:
        return dict(stats.snapshot()["steps"])

    before = steps()
    state.hand_over(StepDecision(Mode.NONE, Phase.DECODE))  # the selector's decision
    model_runner.timed_forward(forward, runner, _fb("graph"))
    # undecided steps: SGLang's own rule (split: TBO; else SBO, on in these settings)
    model_runner.timed_forward(forward, runner, _fb("eager", ForwardMode.EXTEND, tbo=True))
    model_runner.timed_forward(forward, runner, _fb("graph"))
    model_runner.timed_forward(forward, runner, _fb("graph", ForwardMode.IDLE))  # not a step
    model_runner.timed_forward(forward, SimpleNamespace(is_draft_worker=True), _fb("graph"))
    after = steps()
    grown = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert grown == {("decode", "none", "graph"): 1, ("prefill", "tbo", "eager"): 1,
                     ("decode", "sbo", "graph"): 1}


def test_tick_merges_every_sync_steps_and_table_is_served(auto_settings) -> None:
    rt = _runtime(FlatPrior(frozenset({"tbo"})))
    selector_setup.set_runtime(rt)
    cell = cell_index("decode", measure_bucket(8), "none")
    for us in (9999.0, 1500.0):  # the first is dropped: the first of its (phase, mode)
        rt.record(rt.timed_cell(rt.decide("decode", [8])), us)
    for _ in range(3):
        rt.tick()
    assert rt.selector.table.count(cell) == 0 and rt.local.count(cell) == 1
    rt.tick()  # the 4th call syncs (no process group here: this rank's sums are the sums)
    assert rt.selector.table.count(cell) == 1 and rt.local.empty() and rt.syncs == 1
    assert (rt.selector.table.totals[cell], rt.selector.table.squares[cell]) == (1500, 1500**2)
    rt.tick(), rt.tick(), rt.tick(), rt.tick()  # nothing new: the merge adds nothing
    assert rt.selector.table.count(cell) == 1 and rt.selector.table.mean(cell) == 1500.0
    result = SimpleNamespace(internal_state={"x": 1})
    internal_state.add_gate_table(result)
    table = result.internal_state[internal_state.KEY]
    assert table["rows"] == [{"phase": "decode", "tokens": [8, 9], "mode": "none", "count": 1,
                              "mean_ms": 1.5}]
    assert table["prior"].startswith("flat") and result.internal_state["x"] == 1
    rt.selector.decide("decode", [8])
    assert internal_state.served_table(rt)["chosen"] == {"decode/none": 3}


def test_record_clips_a_step_at_1_5x_its_cells_shared_mean() -> None:
    rt = SelectorRuntime(ModeSelector(FlatPrior(frozenset({"tbo"}))), sync_steps=4, cuda=False,
                         setup="t")
    cell = cell_index("decode", measure_bucket(8), "none")
    rt.record(cell, 50.0)  # the first step of (decode, none): dropped
    rt.record(cell, 4000.0)  # nothing shared yet: as measured
    rt.selector.merge_cells([(cell, 1, 1000, 1000**2)])
    rt.record(cell, 4000.0)
    rt.record(cell, 1100.0)
    assert (rt.local.count(cell), rt.local.totals[cell]) == (3, 4000 + 1500 + 1100)
    assert rt.local.squares[cell] == 4000**2 + 1500**2 + 1100**2


def test_broadcast_leader_shares_every_sync_steps_and_followers_time_nothing() -> None:
    flat = FlatPrior(frozenset({"tbo"}))
    leader, follower = (SelectorRuntime(ModeSelector(flat), sync_steps=4, cuda=False, setup="t",
                                         transport="broadcast", source=src)
                        for src in (True, False))
    cell = cell_index("decode", measure_bucket(8), "none")
    for rt in (leader, follower):
        for us in (9999.0, 1500.0, 2500.0):
            rt.tick()
            pending = rt.timed_cell(rt.decide("decode", [8]))
            if pending is not None:
                rt.record(pending, us)
    assert follower.local.empty(), "a follower times nothing"
    assert leader.local.count(cell) == 2 and leader.outgoing() is None, "3 calls < 4"
    leader.tick(), follower.tick()
    share = leader.outgoing()
    assert share == SelectorShare(((cell, 2, 4000, 1500**2 + 2500**2),)) and leader.local.empty()
    assert leader.outgoing() is None, "one share per sync_steps calls"
    leader.record(cell, 100.0)
    for _ in range(4):
        leader.tick()
    assert leader.outgoing(riding=False) is None, "an empty list waits for 4 x sync_steps"
    for _ in range(12):
        leader.tick()
    assert leader.outgoing(riding=False) == SelectorShare(((cell, 1, 100, 100**2),))
    for rt in (leader, follower):
        rt.incoming(share)
        assert rt.selector.table.count(cell) == 2 and rt.selector.table.mean(cell) == 2000.0
        assert rt.syncs == 1
    with pytest.raises(ValueError, match="transport must be broadcast or all_reduce"):
        SelectorRuntime(ModeSelector(flat), sync_steps=4, cuda=False, setup="t", transport="gossip")


def test_request_broadcast_hook_is_installed_and_strips_the_share(auto_settings) -> None:
    from sglang.srt.managers.scheduler_components.request_receiver import (
        SchedulerRequestReceiver,
    )

    fn = SchedulerRequestReceiver._broadcast_reqs_across_ranks
    assert request_receiver.broadcast_reqs in [c.cell_contents for c in fn.__closure__ or ()]
    rt = SelectorRuntime(ModeSelector(FlatPrior(frozenset({"tbo"}))), sync_steps=1, cuda=False,
                          setup="t", transport="broadcast", source=True)
    selector_setup.set_runtime(rt)
    cell = cell_index("decode", measure_bucket(8), "none")
    for us in (9999.0, 1500.0):
        rt.tick()
        rt.record(rt.timed_cell(rt.decide("decode", [8])), us)
    sent = []

    def single_rank(self: Any, recv_reqs: Any, local_reqs: Any = None) -> list[Any]:
        sent.append(recv_reqs)  # what upstream would broadcast (tp 1: returns it as is)
        return [*recv_reqs, *(local_reqs or [])]

    out = request_receiver.broadcast_reqs(single_rank, None, ["req"], ["abort"])
    assert out == ["req", "abort"] and sent[0][-1] == SelectorShare(((cell, 1, 1500, 1500**2),))
    assert rt.selector.table.count(cell) == 1 and rt.syncs == 1
    out = request_receiver.broadcast_reqs(single_rank, None, [], None)  # nothing new: no share
    assert out == [] and sent[1] == []
    rt.record(cell, 500.0)
    rt.tick()
    request_receiver.broadcast_reqs(single_rank, None, [], None)
    assert sent[2] == [] and rt.selector.table.count(cell) == 1, "an empty list: not yet"
    request_receiver.broadcast_reqs(single_rank, None, [], ["abort"])  # carries a request
    assert sent[3] == [SelectorShare(((cell, 1, 500, 500**2),))]
    assert rt.selector.table.count(cell) == 2
    # all_reduce: hands straight on
    selector_setup.set_runtime(SelectorRuntime(ModeSelector(FlatPrior(frozenset({"tbo"}))),
                                               sync_steps=1, cuda=False, setup="t"))
    assert request_receiver.broadcast_reqs(single_rank, None, ["req"]) == ["req"]


# -- two real ranks: the all-reduce, or the request broadcast, makes their decisions identical

RANK = textwrap.dedent("""
    import json, os, random, sys
    import torch.distributed as dist
    sys.path.insert(0, os.environ["REPO"])
    from sglang_overlap.planning.cost.prior import FlatPrior
    from sglang_overlap.planning.selector import ModeSelector, SelectorConfig
    from sglang_overlap.sglang.selector_runtime import SelectorRuntime
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method=os.environ["INIT"], rank=rank, world_size=2)
    rt = SelectorRuntime(ModeSelector(FlatPrior(frozenset({"tbo", "sbo"})),
                                      SelectorConfig(explore_share=0.2)),
                         sync_steps=5, cuda=False, setup="t", group=lambda: dist.group.WORLD)
    rng = random.Random(rank)  # each rank times the same steps differently
    truth = {"none": 1000.0, "tbo": 1300.0, "sbo": 950.0}
    out = []
    for step in range(300):
        rt.tick()
        d = rt.decide("decode", [16 + (step // 50)])
        cell = rt.timed_cell(d)
        rt.record(cell, truth[d.mode] * rng.uniform(0.8, 1.2))
        out.append(d.reason)
    print(json.dumps(out))
    dist.destroy_process_group()  # gloo aborts at exit now and then without it
""")


BROADCAST_RANK = textwrap.dedent("""
    import json, os, random, sys
    import torch.distributed as dist
    sys.path.insert(0, os.environ["REPO"])
    from sglang.srt.utils.common import broadcast_pyobj
    from sglang_overlap.planning.cost.prior import FlatPrior
    from sglang_overlap.planning.selector import ModeSelector, SelectorConfig
    from sglang_overlap.sglang import selector_setup
    from sglang_overlap.sglang.upstream import request_receiver
    from sglang_overlap.sglang.selector_runtime import SelectorRuntime
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method=os.environ["INIT"], rank=rank, world_size=2)
    rt = SelectorRuntime(ModeSelector(FlatPrior(frozenset({"tbo", "sbo"})),
                               SelectorConfig(explore_share=0.2)),
                          sync_steps=5, cuda=False, setup="t", transport="broadcast",
                          source=rank == 0)
    selector_setup.set_runtime(rt)

    def upstream(self, recv_reqs, local_reqs=None):  # SGLang's non-DP branch, tp 2
        return broadcast_pyobj(recv_reqs, rank, dist.group.WORLD, src=0)

    rng = random.Random(rank)
    truth = {"none": 1000.0, "tbo": 1300.0, "sbo": 950.0}
    out, received = [], []
    for step in range(300):
        mine = [f"req{step}"] if step % 9 == 0 else []  # mostly empty lists, as in decode
        reqs = request_receiver.broadcast_reqs(upstream, None, mine if rank == 0 else None)
        received.append(reqs)
        rt.tick()
        d = rt.decide("decode", [16 + (step // 50)])
        cell = rt.timed_cell(d)
        if cell is not None:
            rt.record(cell, truth[d.mode] * rng.uniform(0.8, 1.2))
        out.append(d.reason)
    assert received == [[f"req{i}"] if i % 9 == 0 else [] for i in range(300)], received[:10]
    print(json.dumps({"reasons": out, "syncs": rt.syncs, "timed": rank == 0 or rt.local.empty()}))
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("script_text", [RANK, BROADCAST_RANK], ids=["all_reduce", "broadcast"])
def test_two_ranks_decide_identically(tmp_path: Path, script_text: str) -> None:
    script = tmp_path / "rank.py"
    script.write_text(script_text)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "REPO": str(ROOT), "INIT": f"tcp://127.0.0.1:{port}"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    seqs = [json.loads(o) for o, _ in outs]
    if script_text is BROADCAST_RANK:
        assert seqs[0]["syncs"] == seqs[1]["syncs"] >= 20 and seqs[1]["timed"], seqs[1]["syncs"]
        seqs = [s["reasons"] for s in seqs]
    assert seqs[0] == seqs[1]
    modes = [r.split(": ")[1].split(" ")[0] for r in seqs[0]]
    assert any("(refreshing: " in r for r in seqs[0]), "a refresh ran, on both ranks alike"
    assert modes[-100:].count("sbo") >= 60, modes  # sbo, 5% faster than none at +-20% noise


# -- the gate's deployment: redundant experts from SGLang's own parsed flags ----------------------

@pytest.mark.parametrize(("extra", "want"), [
    ([], {"num_redundant_experts": 0, "redundant_experts_used": False}),
    (["--ep-num-redundant-experts", "2"],
     {"num_redundant_experts": 2, "redundant_experts_used": False}),  # copies idle: no dispatch
    (["--ep-num-redundant-experts", "2", "--enable-eplb"],
     {"num_redundant_experts": 2, "redundant_experts_used": True}),
    (["--ep-num-redundant-experts", "2", "--ep-dispatch-algorithm", "static"],
     {"num_redundant_experts": 2, "redundant_experts_used": True}),
])
def test_the_gate_prices_the_redundant_experts_sglang_parsed(
        extra: list[str], want: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang.srt.runtime_context as runtime_context

    server_args, settings = parse_server_args(["--model-path", "/nonexistent/m", *TP2_AUTO[:-2],
                                               *extra])
    assert selector_setup.redundant_experts(server_args) == want
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: SimpleNamespace(
        tp_size=2, moe_ep_size=2, attn_dp_size=1))
    deploy = selector_setup._deployment(settings, server_args)
    assert deploy.ep_size == 2
    assert deploy.num_redundant_experts == want["num_redundant_experts"]
    assert deploy.redundant_experts_used == want["redundant_experts_used"]
