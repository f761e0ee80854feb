"""Measured step times per (phase, token bucket, mode): what the mode selector learns from
the server.

A `StepTable` is a fixed grid of integer cells, the same shape in every process, so that ranks
can exchange measurements as integers: (cell, count, total, squares) cells (`take` /
`add_cells`). Integer sums do not depend on the order ranks are added in, so every rank ends up
with the same table, bit for bit.
Each cell holds a count, a total in microseconds and a sum of squares in us^2 (each step rounded
to a whole us first), so a cell knows the spread of its steps as well as their mean
(`spread`). A step of 100 s adds 10^16 us^2 to its cell's squares: what one share carries
(16 such steps on 8 ranks: 1.3 x 10^18) stays inside the int64 the all-reduce sums in.

Buckets: `measure_bucket(tokens)` is exact below 4 tokens, then 4 buckets per power of two
(each at most 25% wide), 96 buckets in all; the last one (from 7 x 2^22 tokens) takes everything
above. Coarser than the cost model's cache buckets on purpose: each bucket must be measured, so
fewer buckets learn faster.

Recency: `cap(max_count)` scales a cell whose count passed `max_count` back to it (its total and
squares by the same factor, integer arithmetic, identical on every rank), so old measurements
fade and a drifting workload (longer contexts, other traffic) is followed.

Plain Python; mypy --strict.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from sglang_overlap.modes import PHASES, SELECTOR_MODES, Mode, Phase

NUM_BUCKETS = 96
_PHASE_INDEX = {p: i for i, p in enumerate(PHASES)}
_MODE_INDEX = {m: i for i, m in enumerate(SELECTOR_MODES)}
NUM_CELLS = len(PHASES) * NUM_BUCKETS * len(SELECTOR_MODES)

Cell = tuple[int, int, int, int]
"""(cell index, count, total us, sum of squares us^2): what `take` hands out, `add_cells` adds."""


def measure_bucket(tokens: int) -> int:
    """Bucket index of a step with `tokens` tokens on its busiest rank (0 <= index < 96)."""
    if tokens < 4:
        return max(0, tokens)
    e = tokens.bit_length() - 1
    index = 4 * (e - 2) + (tokens >> (e - 2))  # tokens >> (e - 2) is in 4..7
    return index if index < NUM_BUCKETS else NUM_BUCKETS - 1


def bucket_bounds(index: int) -> tuple[int, int]:
    """The token counts [lo, hi] that fall in bucket `index` (hi is open-ended for the last)."""
    if not 0 <= index < NUM_BUCKETS:
        raise ValueError(f"bucket index must be in [0, {NUM_BUCKETS}) (got {index})")
    if index < 4:
        return index, index
    e, top = divmod(index, 4)
    lo = (4 + top) << (e - 1)
    hi = ((5 + top) << (e - 1)) - 1
    return lo, (1 << 62) if index == NUM_BUCKETS - 1 else hi


def cell_index(phase: Phase, bucket: int, mode: Mode) -> int:
    return ((_PHASE_INDEX[phase] * NUM_BUCKETS + bucket) * len(SELECTOR_MODES)
            + _MODE_INDEX[mode])


def bucket_of(cell: int) -> int:
    """The load bucket of a cell (`cell_index(phase, bucket, mode)`)."""
    return cell // len(SELECTOR_MODES) % NUM_BUCKETS


@dataclass(frozen=True)
class TableRow:
    phase: Phase
    bucket: int
    tokens_lo: int
    tokens_hi: int
    mode: Mode
    count: int
    mean_us: float


class StepTable:
    """Counts, microsecond totals and sums of squares per cell; `mean` and `spread` read one."""

    __slots__ = ("counts", "squares", "totals")

    def __init__(self) -> None:
        self.counts = [0] * NUM_CELLS
        self.totals = [0] * NUM_CELLS
        self.squares = [0] * NUM_CELLS

    def add(self, cell: int, us: float) -> None:
        """One measured step (`cell` from `cell_index`), rounded to a whole us."""
        v = int(us + 0.5)
        self.counts[cell] += 1
        self.totals[cell] += v
        self.squares[cell] += v * v

    def count(self, cell: int) -> int:
        return self.counts[cell]

    def mean(self, cell: int) -> float | None:
        n = self.counts[cell]
        return self.totals[cell] / n if n else None

    def spread(self, cell: int) -> float | None:
        """The standard error of the cell's mean in us: its steps' sample standard deviation
        over sqrt(count); None below two steps."""
        n = self.counts[cell]
        if n < 2:
            return None
        t = self.totals[cell]
        # n^2 (n - 1) x the squared error, exact in integers; negative only after a cap's floor
        scaled = max(0, n * self.squares[cell] - t * t)
        return math.sqrt(scaled / (n * n * (n - 1)))

    def add_cells(self, cells: Iterable[Cell], max_count: int | None = None) -> None:
        """Add (cell, count, total us, squares us^2) cells, e.g. another rank's `take`; with
        `max_count`, cap the cells touched (`cap`). Costs O(cells)."""
        counts, totals, squares = self.counts, self.totals, self.squares
        for cell, count, total, square in cells:
            if not 0 <= cell < NUM_CELLS or count < 0:
                raise ValueError(f"a step-table cell needs 0 <= cell < {NUM_CELLS} and "
                                 f"count >= 0 (got {(cell, count, total, square)})")
            n = counts[cell] + count
            t = totals[cell] + total
            q = squares[cell] + square
            if max_count is not None and n > max_count:
                t, q, n = t * max_count // n, q * max_count // n, max_count
            counts[cell], totals[cell], squares[cell] = n, t, q

    def take(self, cells: Iterable[int]) -> list[Cell]:
        """(cell, count, total us, squares us^2) of each of `cells` holding a measurement, in
        the order given, and those cells emptied."""
        counts, totals, squares = self.counts, self.totals, self.squares
        out = []
        for c in cells:
            n = counts[c]
            if n:  # a cell named twice is taken once
                out.append((c, n, totals[c], squares[c]))
                counts[c] = totals[c] = squares[c] = 0
        return out

    def clear(self) -> None:
        self.counts = [0] * NUM_CELLS
        self.totals = [0] * NUM_CELLS
        self.squares = [0] * NUM_CELLS

    def empty(self) -> bool:
        return not any(self.counts)

    def cap(self, max_count: int) -> None:
        """Scale every cell with more than `max_count` steps back to `max_count` (same mean,
        about the same spread)."""
        if max_count < 1:
            raise ValueError(f"max_count must be >= 1 (got {max_count})")
        for i, n in enumerate(self.counts):
            if n > max_count:
                self.totals[i] = self.totals[i] * max_count // n
                self.squares[i] = self.squares[i] * max_count // n
                self.counts[i] = max_count

    def rows(self) -> list[TableRow]:
        """Every measured cell, by phase, bucket and mode."""
        out: list[TableRow] = []
        for phase in PHASES:
            for bucket in range(NUM_BUCKETS):
                for mode in SELECTOR_MODES:
                    cell = cell_index(phase, bucket, mode)
                    n = self.counts[cell]
                    if n:
                        lo, hi = bucket_bounds(bucket)
                        out.append(TableRow(phase, bucket, lo, hi, mode, n,
                                            self.totals[cell] / n))
        return out


def format_rows(rows: Iterable[TableRow]) -> str:
    """One line per (phase, bucket): every measured mode's mean step time and count."""
    grouped: dict[tuple[str, int, int, int], list[TableRow]] = {}
    for r in rows:
        grouped.setdefault((r.phase, r.bucket, r.tokens_lo, r.tokens_hi), []).append(r)
    lines = []
    for (phase, _, lo, hi), cells in grouped.items():
        span = f"{lo}" if lo == hi else f"{lo}-{hi if hi < (1 << 62) else 'inf'}"
        body = ", ".join(f"{c.mode}={c.mean_us / 1e3:.3f}ms x{c.count}" for c in cells)
        lines.append(f"{phase} tokens {span}: {body}")
    return "\n".join(lines)


__all__ = ["NUM_BUCKETS", "NUM_CELLS", "Cell", "StepTable", "TableRow",
           "bucket_bounds", "cell_index", "format_rows", "measure_bucket"]
