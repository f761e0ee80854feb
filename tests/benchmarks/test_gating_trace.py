"""benchmarks/gating_trace.py on CPU: the decode trace, padding, which modes a step can replay,
fixed and auto passes on a known cost table (the real selector, fed by event pairs with CUDA's
interface), and the ratios against the best fixed policy."""

from __future__ import annotations

import statistics

import pytest

from benchmarks import gating_trace as gt

SIZES = (1, 4, 16, 32, 64, 128, 256)
GRAPHS = frozenset({(m, b) for b in SIZES for m in ("none", "sbo")}
                   | {("tbo", b) for b in SIZES if b >= 2})


def cost(mode: str, bs: int) -> float:
    """us: sbo best below 32, none in between, tbo from 128 (by 20-30%); tbo within the
    selector's 10% exploration margin elsewhere, so a flat prior finds it."""
    base = 1000.0 + 4.0 * bs
    if mode == "sbo":
        return base * (0.8 if bs < 32 else 1.2)
    if mode == "tbo":
        return base * (0.7 if bs >= 128 else 1.05)
    return base


def replayer(done: bool = True):
    clock = [0.0]
    calls: list[tuple[str, int]] = []

    def replay(mode: str, bs: int) -> tuple[gt.FakeEvent, gt.FakeEvent]:
        assert (mode, bs) in GRAPHS, f"{mode=} {bs=} has no graph"
        calls.append((mode, bs))
        start = gt.FakeEvent(clock[0], done)
        clock[0] += cost(mode, bs)
        return start, gt.FakeEvent(clock[0], done)

    return replay, calls


def test_trace_is_seeded_bounded_and_drifts() -> None:
    t = gt.decode_trace(3000, 256, seed=3)
    assert t == gt.decode_trace(3000, 256, seed=3) and t != gt.decode_trace(3000, 256, seed=4)
    assert min(t) >= 1 and max(t) <= 256
    assert min(t[:50]) <= 4 and max(t) >= 200  # from near idle to near full
    buckets = {gt.padded_size(b, SIZES) for b in t}
    assert buckets == set(SIZES), buckets
    steps = [abs(a - b) for a, b in zip(t, t[1:], strict=False)]
    assert max(steps) <= 16, max(steps)  # a drift, not jumps
    with pytest.raises(ValueError, match="decode_trace"):
        gt.decode_trace(10, 8, low=9)


def test_padding_and_available_modes() -> None:
    assert [gt.padded_size(b, SIZES) for b in (1, 2, 4, 5, 16, 17, 129, 256)] == [
        1, 4, 4, 16, 16, 32, 256, 256]
    with pytest.raises(ValueError, match="above the largest"):
        gt.padded_size(257, SIZES)
    assert gt.available(1, 1, GRAPHS) == {"sbo"}  # one sequence: no split
    assert gt.available(2, 4, GRAPHS) == {"sbo", "tbo"}
    assert gt.available(3, 4, frozenset({("none", 4), ("tbo", 4)})) == {"tbo"}


@pytest.mark.parametrize("policy", gt.FIXED)
def test_fixed_pass_runs_its_mode_where_it_can(policy: str) -> None:
    trace = [1, 2, 40, 200, 1]
    replay, calls = replayer()
    res = gt.run_policy(policy, trace, SIZES, GRAPHS, replay)
    want = [policy if policy != "tbo" or b >= 2 else "none" for b in trace]
    assert res.modes == want and calls == list(zip(want, [1, 4, 64, 256, 1], strict=True))
    assert res.step_us() == pytest.approx([cost(m, p) for m, p in calls])
    assert not any(res.explored)


def test_auto_learns_the_fastest_mode_per_size() -> None:
    trace = gt.decode_trace(4000, 256, seed=1)
    table = {(m, b): cost(m, b) for m, b in GRAPHS}
    totals = {}
    for p in gt.FIXED:
        totals[p] = sum(gt.run_policy(p, trace, SIZES, GRAPHS, replayer()[0]).step_us())
    rt = gt.new_runtime(frozenset({"tbo", "sbo"}))
    auto = gt.run_policy("auto", trace, SIZES, GRAPHS, replayer()[0], rt)
    totals["auto"] = sum(auto.step_us())
    oracle = gt.oracle_us(auto.padded, trace, table, GRAPHS)
    assert oracle < min(totals[p] for p in gt.FIXED) * 0.97
    # the selector pays for learning (trials per bucket, hysteresis, shares every 16 steps):
    # within 10% of the per-step oracle, ahead of every fixed mode but the best
    assert totals["auto"] <= oracle * 1.10, (totals["auto"], oracle)
    assert sorted(totals, key=totals.__getitem__)[:2] in (["tbo", "auto"], ["auto", "tbo"])
    for size, best in ((16, "sbo"), (64, "none"), (256, "tbo")):
        ran = [m for m, p in zip(auto.modes, auto.padded, strict=True) if p == size]
        assert max(gt.FIXED, key=ran.count) == best, (size, {m: ran.count(m) for m in gt.FIXED})
    explored = sum(auto.explored)
    assert 0 < explored <= 0.05 * len(trace) + 1, explored
    hand = sum(cost(m, p) - min(cost(k, p) for k in ("none", *gt.available(b, p, GRAPHS)))
               for m, p, b, x in zip(auto.modes, auto.padded, trace, auto.explored, strict=True)
               if x)
    assert gt.explore_cost_us(auto, table, GRAPHS, trace) == pytest.approx(hand)
    assert auto.per_mode()["tbo"] > 0 and auto.per_mode()["sbo"] > 0


def test_auto_learns_only_from_completed_events() -> None:
    trace = [64] * 300
    rt = gt.new_runtime(frozenset({"tbo", "sbo"}))
    gt.run_policy("auto", trace, SIZES, GRAPHS, replayer(done=False)[0], rt)
    assert sum(rt.selector.table.counts) == 0  # nothing completed: nothing measured
    with pytest.raises(ValueError, match="SelectorRuntime"):
        gt.run_policy("auto", trace, SIZES, GRAPHS, replayer()[0])
    with pytest.raises(ValueError, match="policy"):
        gt.run_policy("fast", trace, SIZES, GRAPHS, replayer()[0])


def test_summarize_ratios_against_the_best_fixed_policy() -> None:
    s = gt.summarize({"none": [10.0, 12.0], "tbo": [8.0, 9.0], "auto": [8.0 / 0.99, 9.0 / 0.99]})
    assert s["best_fixed"] == "tbo"
    r = s["ratios"]["auto"]
    assert (r["ratio"], r["low"], r["high"]) == pytest.approx((0.99, 0.99, 0.99))
    assert s["ratios"]["tbo"]["ratio"] == pytest.approx(1.0)
    assert s["ratios"]["none"]["ratio"] == pytest.approx(statistics.geometric_mean([0.8, 0.75]))
    with pytest.raises(ValueError, match="fixed policy"):
        gt.summarize({"auto": [1.0]})
