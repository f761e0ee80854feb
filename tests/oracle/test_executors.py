"""Every executor equals the serial one bit for bit (float32, reference backend, one rank), the
TBO stage order matches SGLang's published schedules, and the hot path never syncs."""

from __future__ import annotations

import pytest
import torch

from sglang_overlap.planning.two_batch import ForwardKind
from tests.fixtures.oracle_cases import (
    EXECUTORS,
    Case,
    assert_bitwise,
    local_layers,
    no_host_sync,
    run,
)
from tests.oracle import executors
from tests.oracle.stages import build_program, split_stages

DECODE = ForwardKind.DECODE
EXTEND = ForwardKind.EXTEND

CASES = {
    "decode_bs1": Case(DECODE, (1,), (6,)),
    "decode_bs2": Case(DECODE, (1, 1), (3, 0)),
    "decode_bs7": Case(DECODE, (1,) * 7, (5, 3, 8, 1, 0, 2, 9), seed=3),
    "decode_bs33": Case(DECODE, (1,) * 33, tuple(range(33)), seed=4),
    "verify_bs5_draft3": Case(ForwardKind.TARGET_VERIFY, (3,) * 5, (4, 1, 7, 2, 2), seed=5),
    "extend_single_token": Case(EXTEND, (1,), (0,), seed=6),
    "extend_balanced": Case(EXTEND, (5, 9, 3, 4), (0, 2, 0, 7), seed=7),
    "extend_two_chunk_long": Case(EXTEND, (37,), (5,), seed=8),
    "extend_two_chunk_mixed": Case(EXTEND, (2, 41, 1), (1, 0, 3), seed=9),
    "extend_attn_tp2_odd": Case(EXTEND, (3, 4, 6), (0, 0, 1), seed=10, attn_tp_size=2),
    "decode_attn_tp2_odd": Case(DECODE, (1,) * 5, (1, 2, 3, 4, 5), seed=11, attn_tp_size=2),
}


def _capacity(case: Case) -> int:
    return max(case.num_tokens, 1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_executors_bitwise_equal_serial(name: str) -> None:
    case = CASES[name]
    make = lambda c: local_layers(c, _capacity(c))  # noqa: E731
    want = run(case, "serial_ll", make)
    for executor in EXECUTORS[1:]:
        if executor.startswith("sbo") and case.kind is EXTEND and case.num_tokens > 16:
            continue  # SBO is a low-latency (decode-sized) mode; keep the suite fast
        assert_bitwise(run(case, executor, make), want, f"{name=} {executor=}")


def test_two_chunk_cases_really_cut_a_request() -> None:
    for name in ("extend_two_chunk_long", "extend_two_chunk_mixed"):
        plan = CASES[name].plan()
        a, b = plan.children
        assert plan.two_chunk and a.seq_end - 1 == b.seq_start, f"{name=} {plan=}"
    assert any(c.plan().children[0].pad or c.plan().children[1].pad
               for c in CASES.values()), "no case exercises attn_tp padding"


def test_two_chunk_b_before_a_breaks_equality() -> None:
    """Negative control: child B attends to A's KV, so running B's stages first must differ."""
    case = CASES["extend_two_chunk_long"]
    layers = local_layers(case, _capacity(case))
    want = run(case, "serial_normal", lambda c: local_layers(c, _capacity(c)))
    program = build_program(layers, case.attention(), "prefill")
    a, b = executors.split_micro_batches(case.hidden(), case.plan())
    executors.run_interleaved(program, b, a, 0)  # B leads
    got = executors.merge_micro_batches(a, b)
    assert not torch.equal(got, want)


def test_decode_order_matches_published_schedule() -> None:
    case = CASES["decode_bs7"]
    order: list[str] = []
    run(case, "tbo", lambda c: local_layers(c, 8), order_out=order)
    # 5 yields per layer -> 5L + 1 stages; B starts two stages behind (SGLang's decode table)
    assert order[:8] == ["A0", "A1", "A2", "B0", "A3", "B1", "A4", "B2"], order
    assert len(order) == 2 * (5 * 2 + 1)
    assert order[-2:] == ["B9", "B10"]


def test_prefill_order_and_stage_contents() -> None:
    case = CASES["extend_balanced"]
    order: list[str] = []
    run(case, "tbo", lambda c: local_layers(c, 32), order_out=order)
    assert order == [f"{m}{i}" for i in range(2 * 2 + 1) for m in "AB"], order
    stages = split_stages(build_program(local_layers(case, 32)[:1], case.attention(), "prefill"))
    names = [[op.name for op in s] for s in stages]
    assert names == [
        ["attn_prepare", "attn_core", "gate", "select_experts", "dispatch_send"],
        ["dispatch_recv", "experts", "combine_send"],
        ["shared_experts", "combine_recv", "output"],
    ]


def test_decode_stage_contents() -> None:
    case = CASES["decode_bs2"]
    stages = split_stages(build_program(local_layers(case, 2)[:1], case.attention(), "decode"))
    assert [[op.name for op in s] for s in stages] == [
        ["attn_prepare"],
        ["attn_core", "gate", "select_experts"],
        ["dispatch_send", "shared_experts"],
        ["dispatch_recv", "experts", "combine_send"],
        ["combine_recv"],
        ["output"],
    ]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_hot_path_has_no_host_sync(executor: str) -> None:
    for name in ("decode_bs7", "extend_two_chunk_mixed"):
        case = CASES[name]
        make = lambda c: local_layers(c, _capacity(c))  # noqa: E731
        layers, x, attn = make(case), case.hidden(), case.attention()
        with no_host_sync(allowed=()):
            if executor == "tbo":
                schedule = "prefill" if case.kind is EXTEND else "decode"
                executors.execute_tbo(layers, x, case.plan(), schedule=schedule, attention=attn)
            else:
                run(case, executor, lambda c, layers=layers: layers)


def test_no_host_sync_guard_fires() -> None:
    with no_host_sync(allowed=()), pytest.raises(AssertionError, match="Tensor.item"):
        torch.ones(1).item()
    with no_host_sync(allowed=()), pytest.raises(AssertionError, match="__bool__"):
        bool(torch.ones(1) > 0)
    assert torch.ones(1).item() == 1.0  # restored


def test_bad_schedule_and_plan_are_refused() -> None:
    case = CASES["decode_bs2"]
    layers = local_layers(case, 2)
    with pytest.raises(ValueError, match="schedule"):
        executors.execute_tbo(layers, case.hidden(), case.plan(), schedule="sbo")
    with pytest.raises(ValueError, match="does not tile"):
        executors.execute_tbo(layers, torch.zeros(3, 64), case.plan())


def test_gate_and_shared_callables_replace_the_weights() -> None:
    """The glue can hand in the model's own gate and shared expert as callables."""
    from dataclasses import replace

    from tests.oracle.experts import swiglu
    from tests.oracle.router import gate_logits

    case = CASES["decode_bs7"]
    want = run(case, "tbo", lambda c: local_layers(c, 8))
    calls: list[str] = []

    def with_fns(c: Case) -> list:  # type: ignore[type-arg]
        out = []
        for layer in local_layers(c, 8):
            def gate(h: torch.Tensor, w: torch.Tensor = layer.gate_w) -> torch.Tensor:
                calls.append("gate")
                return gate_logits(h, w)

            def shared(h: torch.Tensor, w13: torch.Tensor = layer.shared_w13,
                       w2: torch.Tensor = layer.shared_w2) -> torch.Tensor:
                calls.append("shared")
                return swiglu(h, w13, w2)

            out.append(replace(layer, gate_w=torch.zeros_like(layer.gate_w), shared_w13=None,
                               shared_w2=None, gate_fn=gate, shared_fn=shared))
        return out

    assert_bitwise(run(case, "tbo", with_fns), want, "callables")
    assert calls.count("gate") == calls.count("shared") == 2 * 2  # 2 layers x 2 micro-batches
