"""The TBO stage order: SGLang's published interleaving, by hand and by brute force."""

from __future__ import annotations

import pytest

from sglang_overlap.planning.interleave import interleaved_order


def _upstream(num_stages: int, delta: int) -> list[tuple[int, int]]:
    """SGLang 0.5.23's execute_overlapped_operations loop, on stage counters."""
    a = b = 0
    out: list[tuple[int, int]] = []
    for _ in range(delta):
        out.append((0, a)); a += 1  # noqa: E702
    for _ in range(num_stages - delta):
        out.append((0, a)); a += 1  # noqa: E702
        out.append((1, b)); b += 1  # noqa: E702
    for _ in range(delta):
        out.append((1, b)); b += 1  # noqa: E702
    return out


def test_decode_table() -> None:
    names = ["AB"[m] + str(s) for m, s in interleaved_order(6, 2)]
    assert names == ["A0", "A1", "A2", "B0", "A3", "B1", "A4", "B2", "A5", "B3", "B4", "B5"]


def test_prefill_alternates() -> None:
    assert interleaved_order(3, 0) == ((0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2))


@pytest.mark.parametrize("n", range(0, 12))
def test_matches_upstream_and_a_leads(n: int) -> None:
    for delta in range(n + 1):
        order = interleaved_order(n, delta)
        assert list(order) == _upstream(n, delta), f"{n=} {delta=}"
        pos = {x: i for i, x in enumerate(order)}
        assert all(pos[(0, s)] < pos[(1, s)] for s in range(n)), f"{n=} {delta=}"


@pytest.mark.parametrize(("n", "delta"), [(3, 4), (3, -1), (-1, 0)])
def test_bad_delta(n: int, delta: int) -> None:
    with pytest.raises(ValueError):
        interleaved_order(n, delta)


@pytest.mark.parametrize(("stages", "delta", "message"), [
    (-1, 0, "num_stages must be >= 0; got num_stages=-1"),
    (3, 4, "TBO delta_stages=4 must be in [0, 3] (the number of stages)"),
    (3, -1, "TBO delta_stages=-1 must be in [0, 3] (the number of stages)"),
])
def test_bad_arguments_are_named(stages: int, delta: int, message: str) -> None:
    with pytest.raises(ValueError) as info:
        interleaved_order(stages, delta)
    assert str(info.value) == message
