"""The SBO watchdog's diagnosis on CPU: which units the combine send waits on per form, and the
error text that names them (the device side runs in tests/gpu/test_sbo_layer.py)."""

from __future__ import annotations

from benchmarks.harness.sbo_watchdog import diagnose, waited_units
from sglang_overlap.planning.sbo_layout import plan_sbo_layout


def _layout(granularity: str):
    return plan_sbo_layout(num_local_experts=3, capacity=256, block_m=64, block_n=128,
                           hidden=7168, num_sms=132, comm_num_sms=3,
                           granularity=granularity)  # type: ignore[arg-type]


def test_per_block_waits_only_on_blocks_with_rows() -> None:
    lay = _layout("block")  # antgroup-opt: blocks < ceil(count / block_m), nothing for count 0
    assert waited_units(lay, [0, 65, 256]) == [(4, 1, 0), (5, 1, 1), (8, 2, 0), (9, 2, 1),
                                               (10, 2, 2), (11, 2, 3)]


def test_per_expert_waits_on_every_expert() -> None:
    assert waited_units(_layout("expert"), [0, 0, 5]) == [(0, 0, 0), (1, 1, 0), (2, 2, 0)]


def test_diagnosis_names_units_below_their_value() -> None:
    lay = _layout("block")
    counters = [lay.expect_value] * lay.num_signals
    counters[5], counters[9] = 3, lay.expect_value + 1
    text = diagnose(lay, counters, [0, 65, 256])
    assert text.startswith("2 unit(s)") and "expert 1 block 1 (signal[5]=3)" in text
    assert f"expert 2 block 1 (signal[9]={lay.expect_value + 1})" in text
    assert "send itself has not run" in diagnose(lay, [lay.expect_value] * 12, None)
    assert "could not be read" in diagnose(lay, None, None)
