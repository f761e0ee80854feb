"""Tests for modes.py: the names, their sets, the parsers and SGLang's own rule."""

from __future__ import annotations

import json
import pickle

import pytest

from sglang_overlap.modes import (
    CANDIDATES,
    ENABLABLE,
    GRAPH_ORDER,
    PLAN_MODES,
    SELECTOR_MODES,
    SPLITS_BATCH,
    TIE_ORDER,
    Mode,
    Phase,
    StepDecision,
    mode_of,
    phase_of,
    upstream_rule,
)


def test_a_member_is_its_name_everywhere_a_string_goes() -> None:
    assert Mode.TBO == "tbo" and f"{Mode.TWO_CHUNK}" == "two_chunk"
    assert str(Phase.DECODE) == "decode"
    assert json.dumps({Mode.SBO: [Phase.PREFILL]}) == '{"sbo": ["prefill"]}'
    assert {"none": 1}[Mode.NONE] == 1 and pickle.loads(pickle.dumps(Mode.TBO)) is Mode.TBO


def test_the_sets_agree() -> None:
    assert set(SELECTOR_MODES) < set(PLAN_MODES) == set(Mode)
    assert ENABLABLE == set(Mode) - {Mode.NONE} and SPLITS_BATCH < ENABLABLE
    assert set(GRAPH_ORDER) == set(SELECTOR_MODES) and GRAPH_ORDER[-1] == Mode.NONE
    assert sorted(Mode, key=TIE_ORDER.__getitem__)[0] == Mode.NONE
    assert set(CANDIDATES) == set(Phase)
    for by_mode in CANDIDATES.values():
        assert set(by_mode) <= set(SELECTOR_MODES) - {Mode.NONE}
        assert all(enablers <= ENABLABLE for enablers in by_mode.values())


def test_parsers_name_the_known_values() -> None:
    assert mode_of("sbo") is Mode.SBO and phase_of("prefill") is Phase.PREFILL
    with pytest.raises(ValueError, match="unknown overlap mode 'dbo' .*none, tbo, sbo, two_chunk"):
        mode_of("dbo")
    with pytest.raises(ValueError, match="phase must be decode or prefill \\(got 'extend'\\)"):
        phase_of("extend")


@pytest.mark.parametrize(("split", "sbo", "want"), [
    (True, True, Mode.TBO), (True, False, Mode.TBO),  # SBO does not apply inside TBO
    (False, True, Mode.SBO), (False, False, Mode.NONE)])
def test_sglangs_own_rule(split: bool, sbo: bool, want: Mode) -> None:
    d = upstream_rule(Phase.DECODE, split, sbo)
    assert (d.mode, d.phase, d.cell, d.source) == (want, Phase.DECODE, None, "upstream")


def test_the_reason_line() -> None:
    d = StepDecision(Mode.SBO, Phase.DECODE, 5, "still the fastest", estimates={
        Mode.NONE: 1500.0, Mode.SBO: 1200.0}, measured=frozenset({Mode.SBO}), busiest=8, mean=6.5,
        step=3)
    assert d.reason == ("step 3 decode busiest=8 mean=6.5 tokens/rank: sbo (still the fastest); "
                        "none=1.500ms(prior), sbo=1.200ms")
