"""planning/producer_tables.py: the bucket rule, the padded rule, and what a file must say."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest

from sglang_overlap.planning.cost.profiles import ProfileError
from sglang_overlap.planning.producer_tables import (
    PROVENANCE_KEYS,
    bucket,
    load_producer_tables,
    parse_producer_tables,
    tables_for_gpu,
)

H200_FILE = (Path(__file__).resolve().parents[2] / "sglang_overlap" / "profiles"
             / "producer-H200.json")


@pytest.mark.parametrize(("bounds", "value", "want"), [
    ((8, 16, 32), 1, 0), ((8, 16, 32), 8, 0), ((8, 16, 32), 9, 1), ((8, 16, 32), 16, 1),
    ((8, 16, 32), 17, 2), ((8, 16, 32), 32, 2), ((8, 16, 32), 33, 2), ((8, 16, 32), 10**6, 2),
    ((64,), 0, 0), ((64,), 65, 0), ((32, 64, 128, 256), 0, 0), ((32, 64, 128, 256), 33, 1),
    ((32, 64, 128, 256), 129, 3), ((15, 16, 32), 15, 0), ((15, 16, 32), 16, 1),
])
def test_bucket_hand_worked(bounds: tuple[int, ...], value: int, want: int) -> None:
    assert bucket(bounds, value) == want, f"{bounds=} {value=}"


def brute_bucket(bounds: tuple[int, ...], value: int) -> int:
    """The nearest bound at or above `value` (the largest when none is)."""
    above = [b for b in bounds if b >= value]
    return bounds.index(min(above)) if above else len(bounds) - 1


def test_bucket_against_brute_force() -> None:
    rng = random.Random(35)
    for _ in range(2000):
        bounds = tuple(sorted(rng.sample(range(1, 600), rng.randint(1, 6))))
        value = rng.randint(-5, 700)
        assert bucket(bounds, value) == brute_bucket(bounds, value), f"{bounds=} {value=}"


@pytest.mark.parametrize(("rows", "capacity", "padded"), [
    (0, 64, False), (1, 64, False), (64, 64, False), (1, 128, True), (64, 128, True),
    (65, 128, False), (128, 128, False), (200, 256, False), (200, 320, True), (0, 128, True),
])
def test_padded_means_capacity_past_the_rows(rows: int, capacity: int, padded: bool) -> None:
    tables = load_producer_tables("H200")
    choice = tables.fallback_choice(8, rows, capacity)
    cell = tables.fallback.pick(8, rows)
    assert choice is (cell.padded if padded else cell.unpadded), f"{rows=} {capacity=}"


def h200() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(H200_FILE.read_text())
    return data


def broken(edit: str) -> dict[str, Any]:
    data = copy.deepcopy(h200())
    if edit == "kind":
        data["kind"] = "gpu"
    elif edit == "format":
        data["format"] = 2
    elif edit == "gpu":
        del data["gpu"]
    elif edit == "descending":
        data["dg_tiles"]["experts"] = [16, 8, 32]
    elif edit == "cells":
        data["dg_tiles"]["cells"] = data["dg_tiles"]["cells"][:2]
    elif edit == "row":
        data["fallback"]["cells"][1] = data["fallback"]["cells"][1][:2]
    elif edit == "signal":
        data["dg_tiles"]["cells"][0][0]["signal"] = "late"
    elif edit == "tile":
        data["dg_tiles"]["cells"][0][0]["block_m"] = 96
    elif edit == "unknown_key":
        data["dg_tiles"]["cells"][0][0]["stages"] = 3
    elif edit == "path":
        data["fallback"]["cells"][0][0]["padded"]["path"] = "deepgemm"
    elif edit == "no_padded":
        del data["fallback"]["cells"][0][0]["padded"]
    elif edit == "fused_warps":
        data["fused"]["cells"][0]["num_warps"] = 0
    elif edit.startswith("provenance."):
        del data["fused"]["provenance"][edit.split(".")[1]]
    return data


@pytest.mark.parametrize("edit", [
    "kind", "format", "gpu", "descending", "cells", "row", "signal", "tile", "unknown_key",
    "path", "no_padded", "fused_warps", *(f"provenance.{k}" for k in PROVENANCE_KEYS)])
def test_a_bad_file_names_what_is_wrong(edit: str) -> None:
    with pytest.raises(ProfileError, match="test.json"):
        parse_producer_tables(broken(edit), "test.json")


def test_the_h200_file_parses_and_unknown_gpus_get_it() -> None:
    tables = parse_producer_tables(h200(), "x.json")
    assert (tables.gpu, tables.dg_tiles.experts, tables.dg_tiles.rows) == (
        "H200", (8, 16, 32), (64, 128, 256))
    assert tables.dg_tile(9, 65).block_n == 128 and tables.fused_tile(65).block_m == 128
    default, note = tables_for_gpu("H20")
    assert default.gpu == "H200" and note is not None and "H20" in note
    own, none = tables_for_gpu("H200")
    assert own.gpu == "H200" and none is None
    with pytest.raises(ProfileError, match="no producer table for GPU 'A100'"):
        load_producer_tables("A100")
    with pytest.raises(ProfileError, match="does not exist"):
        load_producer_tables("/nonexistent/producer-X.json")
