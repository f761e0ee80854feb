"""The producer tables per GPU: the shipped files, the device lookup, and the H200 rule.

The H200's tables were constants in `down_gemm` / `signal_fused` until issue 35; those constants
and the code that read them are kept here verbatim (`old_*`) and compared, shape by shape, with
what the data and the lookup rule now serve on the H200.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from sglang_overlap.kernels import down_gemm, gpu_tables
from sglang_overlap.kernels.signal_deepgemm import DgSignalConfig, max_stages
from sglang_overlap.kernels.signal_fused import SignalGemmConfig, default_config
from sglang_overlap.planning.producer_tables import (
    DEFAULT_GPU,
    load_producer_tables,
    shipped_gpus,
)

PROFILES = Path(down_gemm.__file__).resolve().parents[1] / "profiles"

# --- the pre-issue-35 constants and rules, verbatim (the reference) --------------------------
OLD_DG_SIGNAL_TILES: dict[int, tuple[tuple[int, int], tuple[int, int], tuple[int, int]]] = {
    8: ((64, 160), (128, 160), (128, 192)),
    16: ((64, 128), (128, 128), (128, 160)),
    32: ((64, 160), (128, 160), (128, 192)),
}


def old_dg_signal_config(num_local_experts: int, expected_m: int, capacity: int,
                         k: int = 2048) -> DgSignalConfig:
    bucket = 8 if num_local_experts <= 8 else 16 if num_local_experts <= 16 else 32
    small, mid, large = OLD_DG_SIGNAL_TILES[bucket]
    block_m, block_n = small if expected_m <= 64 else mid if expected_m <= 128 else large
    if capacity % block_m:
        block_m = 64
    return DgSignalConfig(block_m, block_n, max_stages(block_m, block_n, k), store_warp=True)


def old_fallback(e: int, expected_m: int, capacity: int) -> tuple[str, int, int]:
    """(path, slice_experts, streams) of the old choose_signal_path where the patched kernel
    is unavailable and the capacity is a multiple of 64."""
    if expected_m >= 256:
        return ("sliced", max(1, e // 2 if e <= 16 else e // 4), 1)
    if e < 16 and expected_m <= 64:
        if capacity <= 64:
            return ("fused", 0, 1)
        return ("sliced", max(1, e // 4), 2)
    return ("sliced", max(1, e // 4), 2)


def old_fused_config(expected_m: int) -> SignalGemmConfig:
    if expected_m <= 64:
        return SignalGemmConfig(block_m=64, block_n=128, num_warps=8, num_stages=4, ctas_per_sm=2)
    return SignalGemmConfig(block_m=128, block_n=128, num_warps=8, num_stages=3, ctas_per_sm=1)


# --------------------------------------------------------------------------------------------
EXPERTS = list(range(1, 41)) + [48, 64, 72, 128, 256]
ROWS = list(range(0, 300)) + [383, 384, 511, 512, 513, 1024, 4096]
CAPACITIES = [64, 128, 192, 256, 320, 512, 4096]


@pytest.fixture
def pinned(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.delenv(gpu_tables.TABLE_ENV, raising=False)
    gpu_tables.reset()
    yield monkeypatch
    gpu_tables.reset()


@pytest.fixture
def h200(pinned: pytest.MonkeyPatch) -> None:
    pinned.setenv(gpu_tables.TABLE_ENV, "H200")


def fake_device(monkeypatch: pytest.MonkeyPatch, name: str | None) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: name is not None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: name)


def test_h200_patched_tiles_are_the_old_constants(h200: None) -> None:
    for e in EXPERTS:
        for m in ROWS:
            for cap in CAPACITIES:
                got = down_gemm.dg_signal_config(e, m, cap)
                want = old_dg_signal_config(e, m, cap)
                assert got == want, f"{e=} {m=} {cap=} {got=} {want=}"


def test_h200_fallback_is_the_old_rule(h200: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(down_gemm, "_DG_SIGNAL_UNAVAILABLE", ["not in this test"])
    for e in EXPERTS:
        for m in ROWS:
            for cap in CAPACITIES:
                plan = down_gemm.choose_signal_path(e, m, cap)
                got = (plan.path, plan.slice_experts if plan.path == "sliced" else 0,
                       plan.streams)
                assert got == old_fallback(e, m, cap), f"{e=} {m=} {cap=} {plan=}"
                assert plan.why.startswith("H200: "), plan.why


def test_h200_fused_launch_is_the_old_constant(h200: None) -> None:
    for m in ROWS:
        assert default_config(m) == old_fused_config(m), f"{m=}"


@pytest.mark.parametrize("gpu", shipped_gpus())
def test_every_shipped_cell_is_a_legal_config(gpu: str) -> None:
    tables = load_producer_tables(gpu)
    assert tables.gpu == gpu and tables.origin == f"producer-{gpu}.json"
    for row in tables.dg_tiles.cells:
        for tile in row:
            DgSignalConfig(tile.block_m, tile.block_n, 1, eager=tile.signal == "eager",
                           store_warp=tile.signal == "store_warp", multicast=tile.multicast,
                           multicast_on_a=tile.multicast_on_a)
    for tile in tables.fused.cells[0]:
        assert SignalGemmConfig(tile.block_m, tile.block_n, tile.num_warps, tile.num_stages,
                                tile.ctas_per_sm).programs(132) != 0


def test_h100_is_measured_or_says_it_is_h200s() -> None:
    """Never pretend: a table not measured on the H100 says so and holds the H200's numbers."""
    h100, h200 = load_producer_tables("H100"), load_producer_tables("H200")
    for name in ("dg_tiles", "fused", "fallback"):
        table = getattr(h100, name)
        status = table.provenance["status"]
        if status != "measured":
            assert status == "provisional: copied from H200, not measured on H100", status
            same = getattr(h200, name)
            assert (table.experts, table.rows, table.cells) == (same.experts, same.rows,
                                                                same.cells), name
        else:
            assert "H100" in table.provenance["gpu"], table.provenance


def test_the_profiles_folder_ships_what_shipped_gpus_lists() -> None:
    files = sorted(p.name for p in PROFILES.glob("producer-*.json"))
    assert files == [f"producer-{g}.json" for g in shipped_gpus()]
    assert {"H100", "H200"} <= set(shipped_gpus()) and DEFAULT_GPU in shipped_gpus()
    pyproject = (PROFILES.parents[1] / "pyproject.toml").read_text()
    assert '"profiles/*.json"' in pyproject  # package data


@pytest.mark.parametrize(("device", "gpu"), [("NVIDIA H100 80GB HBM3", "H100"),
                                             ("NVIDIA H200", "H200")])
def test_the_device_picks_its_own_tables(pinned: pytest.MonkeyPatch, device: str, gpu: str,
                                         caplog: pytest.LogCaptureFixture) -> None:
    fake_device(pinned, device)
    with caplog.at_level(logging.INFO, logger=gpu_tables.__name__):
        assert gpu_tables.producer_tables().gpu == gpu
    assert not caplog.records


@pytest.mark.parametrize("device", ["NVIDIA H800", "NVIDIA B200", "Some Future GPU", None])
def test_an_unknown_gpu_gets_the_default_with_one_log_line(
        pinned: pytest.MonkeyPatch, device: str | None, caplog: pytest.LogCaptureFixture) -> None:
    fake_device(pinned, device)
    with caplog.at_level(logging.INFO, logger=gpu_tables.__name__):
        for _ in range(3):
            assert gpu_tables.producer_tables().gpu == DEFAULT_GPU
            down_gemm.dg_signal_config(8, 64, 64)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert f"{DEFAULT_GPU}'s tiles" in lines[0]
    assert ("no CUDA GPU" if device is None else "no producer table for GPU") in lines[0]


def test_the_environment_names_a_table_file(pinned: pytest.MonkeyPatch, tmp_path: Path) -> None:
    data = json.loads((PROFILES / "producer-H200.json").read_text())
    data["gpu"] = "Test"
    data["dg_tiles"]["cells"][0][0] = {"block_m": 64, "block_n": 112, "signal": "deferred",
                                       "multicast": 2, "multicast_on_a": True}
    path = tmp_path / "producer-Test.json"
    path.write_text(json.dumps(data))
    pinned.setenv(gpu_tables.TABLE_ENV, str(path))
    fake_device(pinned, "NVIDIA H200")
    assert down_gemm.dg_signal_config(8, 64, 64) == DgSignalConfig(
        64, 112, max_stages(64, 112, 2048), multicast=2, multicast_on_a=True)
    assert down_gemm.dg_signal_config(8, 65, 128).block_n == 160  # the next bucket: H200's
