"""The SBO signal producers' tiles and signal timing per GPU, as data.

`sglang_overlap/profiles/producer-<GPU>.json` (package data, beside the cost profiles) holds
three tables, each measured on that GPU (or marked provisional, with where it was copied from):

- `dg_tiles`: the patched DeepGEMM kernel's tile (block_m, block_n, TMA multicast) and signal
  timing, by local experts E and rows per expert (`kernels/down_gemm.dg_signal_config`);
- `fused`: the Triton producer's tile, warps, stages and persistent programs per SM, by rows
  per expert (`kernels/signal_fused.default_config`);
- `fallback`: the producer served where the patched kernel cannot run (fused, or DeepGEMM
  slices: E / slice_div experts per launch over `streams` streams), by E and rows, for an
  unpadded and a padded buffer (`kernels/down_gemm.choose_signal_path`).

The rule is code, the numbers are data. Each table lists bucket bounds per axis, ascending; a
shape takes the first bucket whose bound is >= its value, and the last bucket above the largest
bound: the nearest measured shape at or above it (`bucket`). A GPU without a file gets
`DEFAULT_GPU`'s tables, and the caller logs that once (`tables_for_gpu`).
A GPU's own file comes from a tuning run on that GPU (the source repository's tune_producer.py
measures `dg_tiles` and writes the file, provenance included).

Plain Python; no torch, no sglang; mypy --strict.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from sglang_overlap.planning.cost.profiles import ProfileError

SignalTiming = Literal["store_warp", "deferred", "eager"]
SIGNAL_TIMINGS: tuple[SignalTiming, ...] = ("store_warp", "deferred", "eager")
FallbackPath = Literal["fused", "sliced"]

FORMAT = 1
DEFAULT_GPU = "H200"
"""The GPU whose tables serve a GPU without its own file (the first card the tables were
measured on)."""
PROVENANCE_KEYS = ("status", "gpu", "when", "where", "release", "how")
"""Every table says: measured or provisional (and copied from where), on which GPU, when,
on which machine / software, on which deep_gemm release, and by what."""


@dataclass(frozen=True)
class DgTile:
    """The patched DeepGEMM kernel's tile and signal timing for one bucket."""

    block_m: int
    block_n: int
    signal: SignalTiming = "store_warp"
    """store_warp: the signalling lane issues the tile's TMA stores; deferred: the lane signals
    at the next tile's store wait; eager: the store threads wait right after their stores."""
    multicast: int = 1
    """CTAs sharing one TMA load (1 or 2)."""
    multicast_on_a: bool = False


@dataclass(frozen=True)
class FusedTile:
    """The Triton producer's launch for one bucket."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    ctas_per_sm: int


@dataclass(frozen=True)
class FallbackChoice:
    """One producer of the fallback table."""

    path: FallbackPath
    why: str
    slice_div: int = 4
    """sliced: max(1, E // slice_div) experts per DeepGEMM launch."""
    streams: int = 1
    """sliced: streams the slices alternate over."""


@dataclass(frozen=True)
class FallbackCell:
    unpadded: FallbackChoice
    """Capacity at most max(64, rows rounded up to 64)."""
    padded: FallbackChoice
    """A larger capacity (DeepEP's buffer padded past the rows)."""


def bucket(bounds: Sequence[int], value: int) -> int:
    """Index of the first bound >= value; the last index above every bound."""
    for index, bound in enumerate(bounds):
        if value <= bound:
            return index
    return len(bounds) - 1


@dataclass(frozen=True)
class Grid:
    """A table over (experts, rows) buckets; `cells[i][j]` serves experts bucket i, rows j."""

    experts: tuple[int, ...]
    rows: tuple[int, ...]
    cells: tuple[tuple[Any, ...], ...]
    provenance: Mapping[str, str]

    def pick(self, experts: int, rows: int) -> Any:
        return self.cells[bucket(self.experts, experts)][bucket(self.rows, rows)]


@dataclass(frozen=True)
class ProducerTables:
    """One GPU's tables (`load_producer_tables`)."""

    gpu: str
    origin: str
    """The file they were read from."""
    dg_tiles: Grid
    fused: Grid
    """experts: one bucket (the Triton tiles depend on rows only)."""
    fallback: Grid

    def dg_tile(self, experts: int, rows: int) -> DgTile:
        tile: DgTile = self.dg_tiles.pick(experts, rows)
        return tile

    def fused_tile(self, rows: int) -> FusedTile:
        tile: FusedTile = self.fused.pick(1, rows)
        return tile

    def fallback_choice(self, experts: int, rows: int, capacity: int) -> FallbackChoice:
        cell: FallbackCell = self.fallback.pick(experts, rows)
        padded = capacity > max(64, -(-max(rows, 0) // 64) * 64)
        return cell.padded if padded else cell.unpadded


def _ints(values: object, where: str) -> tuple[int, ...]:
    if (not isinstance(values, list) or not values
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)):
        raise ProfileError(f"{where} must be a non-empty list of positive integers "
                           f"(got {values!r})")
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ProfileError(f"{where} must be strictly ascending (got {values!r})")
    return tuple(values)


def _fields(cls: type, raw: object, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ProfileError(f"{where} must be an object (got {raw!r})")
    try:
        return cls(**raw)
    except TypeError as exc:
        raise ProfileError(f"{where}: {exc}") from None


def _dg_tile(raw: object, where: str) -> DgTile:
    tile: DgTile = _fields(DgTile, raw, where)
    if tile.block_m not in (64, 128) or tile.block_n % 16 or not 16 <= tile.block_n <= 256:
        raise ProfileError(f"{where}: tile {tile.block_m}x{tile.block_n} is no SM90 tile")
    if tile.signal not in SIGNAL_TIMINGS or tile.multicast not in (1, 2):
        raise ProfileError(f"{where}: signal must be one of {SIGNAL_TIMINGS} and multicast 1 or "
                           f"2 (got {tile.signal!r}, {tile.multicast!r})")
    return tile


def _fused_tile(raw: object, where: str) -> FusedTile:
    tile: FusedTile = _fields(FusedTile, raw, where)
    values = (tile.block_m, tile.block_n, tile.num_warps, tile.num_stages)
    if not all(isinstance(v, int) and v > 0 for v in values) or tile.ctas_per_sm < 0:
        raise ProfileError(f"{where}: every field must be a positive integer (got {raw!r})")
    return tile


def _choice(raw: object, where: str) -> FallbackChoice:
    choice: FallbackChoice = _fields(FallbackChoice, raw, where)
    if choice.path not in ("fused", "sliced") or choice.slice_div < 1 or choice.streams < 1:
        raise ProfileError(f"{where}: path must be fused or sliced, slice_div and streams >= 1 "
                           f"(got {raw!r})")
    return choice


def _fallback_cell(raw: object, where: str) -> FallbackCell:
    if not isinstance(raw, dict) or set(raw) != {"unpadded", "padded"}:
        raise ProfileError(f"{where} must be an object with keys unpadded and padded "
                           f"(got {raw!r})")
    return FallbackCell(_choice(raw["unpadded"], f"{where}.unpadded"),
                        _choice(raw["padded"], f"{where}.padded"))


def _grid(raw: object, where: str, cell: Any, rows_only: bool = False) -> Grid:
    if not isinstance(raw, dict):
        raise ProfileError(f"{where} is missing or not an object")
    provenance = raw.get("provenance")
    if not isinstance(provenance, dict) or not all(
            isinstance(provenance.get(k), str) and provenance[k] for k in PROVENANCE_KEYS):
        raise ProfileError(f"{where}.provenance must give {', '.join(PROVENANCE_KEYS)} "
                           f"(got {provenance!r})")
    rows = _ints(raw.get("rows"), f"{where}.rows")
    experts = (1,) if rows_only else _ints(raw.get("experts"), f"{where}.experts")
    cells = [raw.get("cells")] if rows_only else raw.get("cells")
    if not isinstance(cells, list) or len(cells) != len(experts) or not all(
            isinstance(r, list) and len(r) == len(rows) for r in cells):
        raise ProfileError(f"{where}.cells must be {len(experts)} x {len(rows)} "
                           f"([experts][rows]; got {raw.get('cells')!r:.200})")
    parsed = tuple(tuple(cell(c, f"{where}.cells[{i}][{j}]") for j, c in enumerate(r))
                   for i, r in enumerate(cells))
    return Grid(experts, rows, parsed, dict(provenance))


def parse_producer_tables(data: object, origin: str) -> ProducerTables:
    """The tables of one file's JSON; ProfileError naming the file and the bad key."""
    if not isinstance(data, dict) or data.get("kind") != "producer":
        raise ProfileError(f"{origin}: not a producer table (kind must be 'producer')")
    if data.get("format") != FORMAT:
        raise ProfileError(f"{origin}: format {data.get('format')!r}, this plugin reads {FORMAT}")
    gpu = data.get("gpu")
    if not isinstance(gpu, str) or not gpu:
        raise ProfileError(f"{origin}: gpu must name the GPU (got {gpu!r})")
    return ProducerTables(
        gpu, origin,
        _grid(data.get("dg_tiles"), f"{origin}: dg_tiles", _dg_tile),
        _grid(data.get("fused"), f"{origin}: fused", _fused_tile, rows_only=True),
        _grid(data.get("fallback"), f"{origin}: fallback", _fallback_cell))


def shipped_gpus() -> tuple[str, ...]:
    """GPUs with a packaged producer table."""
    folder = resources.files("sglang_overlap").joinpath("profiles")
    names = (p.name for p in folder.iterdir())
    return tuple(sorted(n[len("producer-"):-len(".json")] for n in names
                        if n.startswith("producer-") and n.endswith(".json")))


def load_producer_tables(spec: str) -> ProducerTables:
    """A shipped GPU's tables by name (`shipped_gpus`), or a producer JSON file's."""
    if spec.endswith(".json"):
        path = Path(spec)
        if not path.is_file():
            raise ProfileError(f"producer table file {spec!r} does not exist")
        text, origin = path.read_text("utf-8"), spec
    else:
        if spec not in shipped_gpus():
            raise ProfileError(f"no producer table for GPU {spec!r}; shipped: "
                               f"{', '.join(shipped_gpus())} (the source repository's "
                               "tune_producer.py writes one)")
        origin = f"producer-{spec}.json"
        text = resources.files("sglang_overlap").joinpath("profiles", origin).read_text("utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{origin} is not valid JSON: {exc}") from None
    return parse_producer_tables(data, origin)


def tables_for_gpu(gpu: str | None) -> tuple[ProducerTables, str | None]:
    """(the tables of GPU `gpu` - a profile name such as H100, None when unknown or absent -,
    the one line to log when they are `DEFAULT_GPU`'s instead, else None)."""
    if gpu is not None and gpu in shipped_gpus():
        return load_producer_tables(gpu), None
    what = "no CUDA GPU" if gpu is None else f"no producer table for GPU {gpu}"
    return load_producer_tables(DEFAULT_GPU), (
        f"{what}: the SBO producers use {DEFAULT_GPU}'s tiles (producer-{DEFAULT_GPU}.json; "
        "the source repository's tune_producer.py measures a GPU's own)")
