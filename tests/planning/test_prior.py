"""Tests for planning/cost/prior.py: what the gate predicts before it has measured.

Contracts: `token_bucket` is exact below 64 tokens, then rounds up to 16 steps per power of two;
the candidates per phase (decode: none, tbo, sbo; prefill: none and the split labelled tbo);
`FlatPrior` predicts every candidate equal; `CostModelPrior` returns exactly what
`cost_model.predict` says for the bucketed load, every candidate (one that does not apply at the
deployment priced as no overlap), cached per bucket.
"""

from __future__ import annotations

import dataclasses

import pytest

from sglang_overlap.modes import ENABLABLE
from sglang_overlap.planning.cost import prior as prior_mod
from sglang_overlap.planning.cost.cost_model import predict
from sglang_overlap.planning.cost.prior import (
    CostModelPrior,
    FlatPrior,
    candidate_modes,
    check_enabled,
    token_bucket,
)
from sglang_overlap.planning.cost.profiles import Deployment, load_hardware, load_model

ALL = frozenset({"tbo", "sbo", "two_chunk"})


# --- token_bucket -------------------------------------------------------------------------------

def test_bucket_is_exact_below_64_and_clamps_negative_to_zero() -> None:
    assert [token_bucket(t) for t in range(64)] == list(range(64))
    assert token_bucket(-5) == 0


@pytest.mark.parametrize(("tokens", "bucket"), [
    (64, 64), (65, 68), (67, 68), (68, 68), (127, 128), (128, 128), (129, 136),
    (255, 256), (256, 256), (257, 272), (1000, 1024), (4097, 4352),
])
def test_bucket_rounds_up_to_sixteen_steps_per_power_of_two(tokens: int, bucket: int) -> None:
    assert token_bucket(tokens) == bucket


@pytest.mark.parametrize("power", range(6, 16))
def test_each_power_of_two_has_sixteen_buckets_that_cover_it(power: int) -> None:
    lo, hi = 1 << power, 1 << (power + 1)
    step = lo // 16
    buckets = {token_bucket(t) for t in range(lo, hi)}
    assert buckets == set(range(lo, hi + 1, step))  # lo, then 16 steps up to hi
    for t in (lo, lo + 1, hi - 1):
        b = token_bucket(t)
        assert t <= b < t + step and b % step == 0


# --- candidates and enabled modes ---------------------------------------------------------------

@pytest.mark.parametrize(("phase", "enabled", "expected"), [
    ("decode", ALL, ("none", "tbo", "sbo")),
    ("decode", frozenset({"sbo"}), ("none", "sbo")),
    ("decode", frozenset({"tbo"}), ("none", "tbo")),
    ("decode", frozenset({"two_chunk"}), ("none",)),
    ("decode", frozenset(), ("none",)),
    ("prefill", ALL, ("none", "tbo")),
    ("prefill", frozenset({"two_chunk"}), ("none", "tbo")),
    ("prefill", frozenset({"tbo"}), ("none", "tbo")),
    ("prefill", frozenset({"sbo"}), ("none",)),
    ("prefill", frozenset(), ("none",)),
])
def test_candidate_modes_per_phase(phase: str, enabled: frozenset[str],
                                   expected: tuple[str, ...]) -> None:
    assert candidate_modes(phase, enabled) == expected


def test_check_enabled_accepts_subsets_and_names_unknown_modes() -> None:
    assert ENABLABLE == ALL
    got = check_enabled({"tbo"})  # type: ignore[arg-type]
    assert got == frozenset({"tbo"}) and isinstance(got, frozenset)
    assert check_enabled(frozenset()) == frozenset()
    with pytest.raises(ValueError, match=r"unknown modes \['none', 'zzz'\].*"
                                         r"\['sbo', 'tbo', 'two_chunk'\]"):
        check_enabled(frozenset({"zzz", "none", "tbo"}))


# --- FlatPrior ----------------------------------------------------------------------------------

def test_flat_prior_predicts_every_candidate_equal() -> None:
    flat = FlatPrior(ALL)
    assert flat.name == "flat (no hardware profile)"
    assert flat.enabled == ALL
    assert flat.candidates("decode") == ("none", "tbo", "sbo")
    assert flat.candidates("prefill") == ("none", "tbo")
    for phase in ("decode", "prefill"):
        preds = flat.predictions(phase, 512, 300.0)
        assert tuple(preds) == flat.candidates(phase)
        assert set(preds.values()) == {1.0}
    assert FlatPrior(frozenset({"sbo"}), why="CPU").name == "flat (CPU)"
    assert FlatPrior(frozenset({"sbo"})).candidates("prefill") == ("none",)
    with pytest.raises(ValueError, match="unknown modes"):
        FlatPrior(frozenset({"bogus"}))


# --- CostModelPrior -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def profiles() -> tuple:
    return load_model("deepseek-v3"), load_hardware("H100")


def _expected(profiles: tuple, deploy: Deployment, modes: list[str], moe: float) -> dict:
    model, hw = profiles
    pred = predict(model, hw, deploy, modes, moe_tokens=moe, timelines=False)
    return {m: e.step_us for m, e in pred.estimates.items()}


def test_cost_model_prior_decode_is_the_cost_model_at_the_bucketed_load(profiles: tuple) -> None:
    model, hw = profiles
    deploy = Deployment(phase="decode", ep_size=16, tokens_per_gpu=8)
    p = CostModelPrior(model, hw, deploy, ALL)
    assert p.name == "cost model (deepseek-v3 on H100)" and p.enabled == ALL
    assert p.candidates("decode") == ("none", "tbo", "sbo")
    assert p.candidates("prefill") == ("none", "tbo")
    got = p.predictions("decode", 100, 70.4)  # buckets: 100 -> 100, round(70.4) = 70 -> 72
    want = _expected(profiles, dataclasses.replace(deploy, tokens_per_gpu=100),
                     ["none", "tbo", "sbo"], 72.0)
    assert got == pytest.approx(want, rel=1e-12) and set(got) == {"none", "tbo", "sbo"}
    assert p.predictions("decode", 100, 69.4) is got  # round(69.4) = 69 -> bucket 72 too
    # the mean rounds half up (exact below 64): 40.5 -> 41, 40.4 -> 40
    base = dataclasses.replace(deploy, tokens_per_gpu=100)
    for mean, moe in ((40.5, 41.0), (40.4, 40.0)):
        assert p.predictions("decode", 100, mean) == pytest.approx(
            _expected(profiles, base, ["none", "tbo", "sbo"], moe), rel=1e-12)
    assert p.predictions("decode", 100, 40.5) != p.predictions("decode", 100, 40.4)


def test_cost_model_prior_decode_rounds_tokens_up_to_whole_sequences(profiles: tuple) -> None:
    model, hw = profiles
    deploy = Deployment(phase="decode", ep_size=16, tokens_per_gpu=8, tokens_per_seq=4)
    p = CostModelPrior(model, hw, deploy, frozenset({"tbo"}))
    for busiest, tokens in ((9, 12), (0, 4), (12, 12)):
        want = _expected(profiles, dataclasses.replace(deploy, tokens_per_gpu=tokens),
                         ["none", "tbo"], 8.0)
        assert p.predictions("decode", busiest, 8.0) == pytest.approx(want, rel=1e-12)


def test_cost_model_prior_prefill_prices_the_split_as_two_chunk(profiles: tuple) -> None:
    model, hw = profiles
    deploy = Deployment(phase="decode", ep_size=16, tokens_per_gpu=8)
    p = CostModelPrior(model, hw, deploy, ALL)
    got = p.predictions("prefill", 4000, 3000.0)
    prefill = dataclasses.replace(deploy, phase="prefill", tokens_per_gpu=token_bucket(4000))
    want = _expected(profiles, prefill, ["none", "two_chunk"], float(token_bucket(3000)))
    assert got == pytest.approx({"none": want["none"], "tbo": want["two_chunk"]}, rel=1e-12)
    # the prefill split is not decode TBO: a decode-priced tbo differs
    decode_tbo = _expected(profiles, dataclasses.replace(prefill, phase="decode"),
                           ["none", "tbo"], float(token_bucket(3000)))["tbo"]
    assert got["tbo"] != pytest.approx(decode_tbo, rel=1e-6)


def test_cost_model_prior_zero_tokens_price_one_token(profiles: tuple) -> None:
    model, hw = profiles
    deploy = Deployment(phase="prefill", ep_size=16, tokens_per_gpu=8)
    p = CostModelPrior(model, hw, deploy, frozenset({"two_chunk"}))
    want = _expected(profiles, dataclasses.replace(deploy, tokens_per_gpu=1),
                     ["none", "two_chunk"], 1.0)
    got = p.predictions("prefill", 0, 0.0)
    assert got == pytest.approx({"none": want["none"], "tbo": want["two_chunk"]}, rel=1e-12)


def test_cost_model_prior_prices_a_mode_that_does_not_apply_as_no_overlap(profiles: tuple) -> None:
    """One expert rank (one GPU): the cost model finds TBO and SBO inapplicable (nothing to hide)
    but the server runs SBO there, so the gate must have a price for it: no overlap's. A mode left
    out stopped the scheduler with KeyError at the first auto step (H100, 2026-12-07)."""
    model, hw = profiles
    single = Deployment(phase="decode", ep_size=1, tokens_per_gpu=8)
    p = CostModelPrior(model, hw, single, ALL)
    assert p.candidates("decode") == ("none", "tbo", "sbo")
    for phase, busiest in (("decode", 32), ("prefill", 512)):
        got = p.predictions(phase, busiest, float(busiest))
        assert tuple(got) == p.candidates(phase)
        none = predict(model, hw, dataclasses.replace(single, phase=phase, tokens_per_gpu=busiest),
                       ["none"], moe_tokens=float(busiest), timelines=False).estimates["none"]
        assert set(got.values()) == {none.step_us}, got
    # where they apply (16 expert ranks) they are priced apart from none: the equality above is
    # the inapplicable case, not every price
    wide = CostModelPrior(model, hw, dataclasses.replace(single, ep_size=16), ALL)
    got = wide.predictions("decode", 32, 32.0)
    assert got["sbo"] != got["none"] and got["tbo"] != got["none"]


def test_cost_model_prior_caches_per_bucket_and_bounds_the_cache(profiles: tuple,
                                                                 monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    model, hw = profiles
    p = CostModelPrior(model, hw, Deployment(phase="decode", ep_size=16), ALL)
    first = p.predictions("decode", 65, 66.0)
    assert p.predictions("decode", 68, 67.9) is first  # same (68, 68) bucket: a dict lookup
    assert p.predictions("prefill", 65, 66.0) is not first  # the phase is part of the key
    limit = prior_mod._CACHE_LIMIT
    assert limit == 4096
    cache = p._cache
    cache.clear()
    cache.update({("decode", -i, 0): {} for i in range(limit - 1)})
    p.predictions("decode", 10, 10.0)
    assert len(cache) == limit  # below the limit: kept
    p.predictions("decode", 11, 10.0)
    assert len(cache) == 1 and ("decode", 11, 10) in cache  # at the limit: cleared, then stored


def test_cost_model_prior_prices_only_its_candidates_without_timelines(
        profiles: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache miss runs the cost model once, for the candidates alone and without timelines."""
    model, hw = profiles
    calls: list[tuple[list[str], bool]] = []

    def spy(*args: object, **kwargs: object) -> object:
        calls.append((list(args[3]), kwargs["timelines"]))  # type: ignore[index]
        return predict(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(prior_mod, "predict", spy)
    p = CostModelPrior(model, hw, Deployment(phase="decode", ep_size=16), frozenset({"sbo"}))
    p.predictions("decode", 32, 32.0)
    p.predictions("prefill", 32, 32.0)
    p.predictions("decode", 32, 32.0)
    assert calls == [(["none", "sbo"], False), (["none"], False)]
