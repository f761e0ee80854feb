"""Paired comparison of benchmark rounds: ratio of one server to the base, with a 95% CI.

Rounds are paired: in round i every server serves the same requests (same seed), one after
the other, so slow drifts of the machine hit both. The ratio of server X to the base is the
geometric mean of the per-round ratios x_i / base_i; its confidence interval is Student's t on
the log-ratios (exp(mean +- t(0.975, n-1) * sd / sqrt(n))). One round gives a ratio, no interval.

Plain Python; no numpy, no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Student's t, 97.5% quantile, by degrees of freedom (1..30), then a few larger ones.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_T975_LARGE = ((40, 2.021), (60, 2.000), (120, 1.980))


def t975(df: int) -> float:
    """Student's t 97.5% quantile for `df` degrees of freedom (>= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1 (got {df})")
    if df <= len(_T975):
        return _T975[df - 1]
    for limit, value in _T975_LARGE:
        if df <= limit:
            return value
    return 1.960


@dataclass(frozen=True)
class Ratio:
    ratio: float  # geometric mean of the per-round ratios
    low: float | None  # 95% CI (None with one round)
    high: float | None
    rounds: int

    def text(self) -> str:
        if self.low is None or self.high is None:
            return f"{self.ratio:.3f}x"
        return f"{self.ratio:.3f}x [{self.low:.3f}, {self.high:.3f}]"


def paired_ratio(values: Sequence[float], base: Sequence[float]) -> Ratio:
    """Ratio of `values` to `base` (same rounds, same order) with its 95% CI."""
    if len(values) != len(base) or not values:
        raise ValueError(f"paired_ratio needs two equally long non-empty series (got "
                         f"{len(values)} and {len(base)})")
    if min(*values, *base) <= 0:
        raise ValueError(f"paired_ratio needs positive values (got {list(values)} / {list(base)})")
    logs = [math.log(v / b) for v, b in zip(values, base, strict=True)]
    n = len(logs)
    mean = sum(logs) / n
    if n == 1:
        return Ratio(math.exp(mean), None, None, 1)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def round_orders(num_servers: int, rounds: int) -> list[list[int]]:
    """The order servers run in each round: forward, then backward (ABBA), so neither is always
    first after the machine idled."""
    forward = list(range(num_servers))
    return [forward if r % 2 == 0 else forward[::-1] for r in range(rounds)]


__all__ = ["Ratio", "mean", "paired_ratio", "round_orders", "t975"]
