"""The SBO down-GEMM entry: which producer runs per shape, and the layout it is given."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from sglang_overlap.kernels import down_gemm, gpu_tables
from sglang_overlap.kernels.down_gemm import (
    DEEPGEMM_CAPACITY_ALIGN,
    choose_signal_path,
    combine_signal_layout,
    dg_config_for_layout,
    fused_config,
    signal_layout,
)
from sglang_overlap.kernels.signal_deepgemm import DgSignalConfig, DgSignalError, max_stages
from sglang_overlap.kernels.signal_fused import default_config
from sglang_overlap.planning.sbo_layout import plan_sbo_layout

STANDIN_DEEP_GEMM = Path(__file__).resolve().parents[1] / "kit" / "standins" / "deep_gemm"


@pytest.fixture(autouse=True)
def h200_tables(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The expectations below are the H200's tables (producer-H200.json), whatever GPU runs."""
    monkeypatch.setenv(gpu_tables.TABLE_ENV, "H200")
    gpu_tables.reset()
    yield
    gpu_tables.reset()


@pytest.fixture(autouse=True)
def patched_deepgemm(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether the patched DeepGEMM producer counts as available: no (its tables are the
    fallback's) unless a test is marked `dg_available`. Its real availability is probed in
    test_probe_result_is_cached_and_logged_once."""
    available = request.node.get_closest_marker("dg_available") is not None
    monkeypatch.setattr(down_gemm, "_DG_SIGNAL_UNAVAILABLE",
                        [""] if available else ["not in this test"])


dg_available = pytest.mark.dg_available


@pytest.fixture(autouse=True)
def fused_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed triton counts as building the fused producer (the AOT compile test checks
    that it does); tests of the other case set `_FUSED_UNAVAILABLE` themselves."""
    monkeypatch.setattr(down_gemm, "_FUSED_UNAVAILABLE", [""])


@pytest.mark.parametrize(
    ("experts", "m", "want"),
    [
        (8, 16, ("sliced", 2, 2)),  # capacity 256 is padded: the fused kernel pays for it
        (8, 64, ("sliced", 2, 2)),
        (8, 128, ("sliced", 2, 2)),
        (8, 256, ("sliced", 4, 1)),
        (16, 16, ("sliced", 4, 2)),
        (16, 256, ("sliced", 8, 1)),
        (32, 64, ("sliced", 8, 2)),
        (32, 256, ("sliced", 8, 1)),
        (2, 512, ("sliced", 1, 1)),
        (1, 128, ("sliced", 1, 2)),
    ],
)
def test_choose_signal_path_table(experts: int, m: int, want: tuple[str, int, int]) -> None:
    # the H200 measurements behind each row: producer-H200.json, fallback.provenance
    plan = choose_signal_path(experts, m, capacity=256)
    assert (plan.path, plan.slice_experts, plan.streams) == want, f"{experts=} {m=} {plan=}"
    assert plan.why


@pytest.mark.parametrize("capacity", [16, 32, 96, 200])
def test_capacities_deepgemm_miscomputes_take_the_fused_kernel(capacity: int) -> None:
    for experts, m in ((32, 64), (16, 256)):
        plan = choose_signal_path(experts, m, capacity)
        assert plan.path == "fused" and str(capacity) in plan.why, f"{capacity=} {plan=}"
    assert choose_signal_path(32, 64, DEEPGEMM_CAPACITY_ALIGN * 3).path == "sliced"


@pytest.mark.parametrize("experts", [1, 8, 15])
@pytest.mark.parametrize("m", [1, 16, 64])
def test_fused_serves_few_experts_in_an_unpadded_buffer(experts: int, m: int) -> None:
    assert choose_signal_path(experts, m, capacity=64).path == "fused"
    padded = choose_signal_path(experts, m, capacity=128)
    assert padded.path == "sliced" and "padded" in padded.why, padded
    assert choose_signal_path(16, m, capacity=64).path == "sliced"


@pytest.mark.parametrize(("experts", "expected_m", "capacity", "m_inner"), [
    (32, 256, 256, True), (32, 192, 256, True),  # every m block has rows, many experts
    (32, 128, 256, False), (32, 64, 256, False),  # empty blocks: n tiles innermost
    (16, 256, 256, False), (8, 256, 256, False), (8, 16, 64, False)])
def test_fused_tile_order(experts: int, expected_m: int, capacity: int, m_inner: bool) -> None:
    layout = signal_layout(num_local_experts=experts, capacity=capacity, hidden=7168,
                           expected_m=expected_m, granularity="expert", num_sms=132,
                           comm_num_sms=3)
    assert fused_config(layout, expected_m).m_inner is m_inner


@pytest.mark.parametrize("expected_m", [1, 64, 65, 256])
@pytest.mark.parametrize("granularity", ["expert", "block"])
def test_signal_layout_follows_the_fused_tiles(expected_m: int, granularity: str) -> None:
    layout = signal_layout(num_local_experts=8, capacity=256, hidden=7168, expected_m=expected_m,
                           granularity=granularity, num_sms=132, comm_num_sms=3)
    tiles = default_config(expected_m)
    assert (layout.block_m, layout.block_n) == (tiles.block_m, tiles.block_n)
    assert layout.granularity == granularity and layout.comm_num_sms == 3
    assert layout.compute_num_sms == 129
    cfg = fused_config(layout, expected_m)
    assert (cfg.block_m, cfg.block_n, cfg.num_warps) == (
        layout.block_m, layout.block_n, tiles.num_warps)
    assert cfg.programs(layout.compute_num_sms) == layout.compute_num_sms * max(
        1, tiles.ctas_per_sm)


@dg_available
@pytest.mark.parametrize(("experts", "m", "capacity", "tile"), [
    (8, 1, 256, (64, 160)), (8, 64, 256, (64, 160)), (8, 128, 128, (128, 160)),
    (8, 256, 256, (128, 192)), (16, 32, 64, (64, 128)), (16, 100, 256, (128, 128)),
    (16, 256, 256, (128, 160)), (32, 64, 256, (64, 160)), (32, 128, 128, (128, 160)),
    (64, 256, 512, (128, 192)),
    (8, 128, 192, (64, 160)),  # 128-row tiles do not divide the capacity
])
def test_patched_deepgemm_is_served_with_the_measured_tiles(experts: int, m: int, capacity: int,
                                                            tile: tuple[int, int]) -> None:
    plan = choose_signal_path(experts, m, capacity)
    assert plan.path == "deepgemm" and plan.dg_config is not None, plan
    assert (plan.dg_config.block_m, plan.dg_config.block_n) == tile
    assert plan.dg_config == down_gemm.dg_signal_config(experts, m, capacity)


@pytest.mark.parametrize(("experts", "m", "capacity"), [(8, 16, 64), (16, 256, 256), (32, 1, 256)])
def test_the_served_config_signals_from_the_store_warp(experts: int, m: int, capacity: int) -> None:
    """The timing measured fastest on the H200 (2026-12-05): the store warp, never eager, and the
    tile without multicast, with the most stages that fit K 2048."""
    cfg = down_gemm.dg_signal_config(experts, m, capacity)
    assert cfg.store_warp and not cfg.eager and cfg.multicast == 1
    assert cfg.num_stages == max_stages(cfg.block_m, cfg.block_n, 2048)


@dg_available
def test_capacity_deepgemm_miscomputes_still_takes_the_fused_kernel() -> None:
    assert choose_signal_path(8, 16, 96).path == "fused"


@dg_available
@pytest.mark.parametrize("granularity", ["block", "expert"])
def test_layouts_follow_the_patched_tiles(granularity: str) -> None:
    layout = signal_layout(num_local_experts=16, capacity=256, hidden=7168, expected_m=200,
                           granularity=granularity, num_sms=132,  # type: ignore[arg-type]
                           comm_num_sms=3)
    assert layout.block_n == 160 and layout.n_tiles == 45  # (128, 160) for E 16, > 128 rows
    assert layout.block_m == (64 if granularity == "block" else 128)
    assert layout.expect_value == (45 if granularity == "block" else 2 * 45)
    per_block = combine_signal_layout("per_block", num_local_experts=8, world_size=2,
                                      num_max_dispatch_tokens_per_rank=128, num_tokens=64,
                                      hidden=7168, expected_m=64, num_sms=132, comm_num_sms=3)
    assert (per_block.block_m, per_block.block_n, per_block.expect_value) == (64, 160, 45)
    assert per_block.compute_num_sms % 2 == 0


@dg_available
def test_a_layout_for_other_tiles_gets_a_matching_config() -> None:
    plan = choose_signal_path(4, 64, 128)
    foreign = plan_sbo_layout(num_local_experts=4, capacity=128, block_m=64, block_n=128,
                              hidden=2048, num_sms=132, comm_num_sms=4, granularity="expert")
    cfg = dg_config_for_layout(plan, foreign, 512)
    assert cfg is not None and (cfg.block_m, cfg.block_n) == (64, 128)
    odd = plan_sbo_layout(num_local_experts=4, capacity=128, block_m=64, block_n=100,
                          hidden=2048, num_sms=132, comm_num_sms=4, granularity="block")
    assert dg_config_for_layout(plan, odd, 512) is None  # 100 is no SM90 block_n: slices


def test_a_matching_config_keeps_the_plans_signal_timing() -> None:
    plan = down_gemm.SignalPlan("deepgemm", dg_config=DgSignalConfig(64, 160, 7, store_warp=True,
                                                                     multicast=2))
    foreign = plan_sbo_layout(num_local_experts=4, capacity=256, block_m=128, block_n=112,
                              hidden=7168, num_sms=132, comm_num_sms=4, granularity="expert")
    cfg = dg_config_for_layout(plan, foreign, 2048)
    assert cfg == DgSignalConfig(128, 112, 6, store_warp=True)  # multicast is the tile's own


@dg_available
def test_a_run_time_failure_falls_back_for_good(caplog: pytest.LogCaptureFixture) -> None:
    assert choose_signal_path(8, 64, 256).path == "deepgemm"
    with caplog.at_level(logging.WARNING, logger=down_gemm.__name__):
        down_gemm._deepgemm_signal_failed(DgSignalError("nvcc failed"))
    assert "nvcc failed" in caplog.text
    plan = choose_signal_path(8, 64, 256)
    assert plan.path == "sliced" and plan.dg_config is None
    assert "failed at run time" in (down_gemm.deepgemm_signal_unavailable() or "")


def test_probe_result_is_cached_and_logged_once(monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """The real probe of this environment (sglang 0.5.23 installs deep_gemm 0.2.x, which the
    patch does not cover): one log line, then the cached answer."""
    from sglang_overlap.kernels.signal_deepgemm import probe

    monkeypatch.setattr(down_gemm, "_DG_SIGNAL_UNAVAILABLE", [])
    why = probe()
    with caplog.at_level(logging.INFO, logger=down_gemm.__name__):
        first = down_gemm.deepgemm_signal_unavailable()
        second = down_gemm.deepgemm_signal_unavailable()
    assert first == second == why
    lines = [r for r in caplog.records if "patched DeepGEMM producer" in r.getMessage()]
    assert len(lines) == (1 if why else 0)


def test_a_multicast_tile_drops_multicast_where_it_cannot_launch() -> None:
    cfg = DgSignalConfig(64, 112, 9, store_warp=True, multicast=2, multicast_on_a=True)
    assert down_gemm.launchable(cfg, 7168, 128) is cfg  # 64 n tiles, even SMs
    single = DgSignalConfig(64, 112, 9, store_warp=True)
    assert down_gemm.launchable(cfg, 6144, 128) == single  # 55 n tiles
    assert down_gemm.launchable(cfg, 7168, 129) == single


@pytest.fixture
def standin_deep_gemm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test kit's CPU deep_gemm stand-in (sgl-deep-gemm 0.2.3.post2's API) as `deep_gemm`."""
    import sys

    from sglang_overlap.kernels import deepgemm

    monkeypatch.syspath_prepend(str(STANDIN_DEEP_GEMM))
    for name in [m for m in sys.modules if m.split(".")[0] == "deep_gemm"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(deepgemm, "_API", None)
    yield
    for name in [m for m in sys.modules if m.split(".")[0] == "deep_gemm"]:
        del sys.modules[name]


@pytest.mark.parametrize("granularity", ["expert", "block"])
def test_off_cuda_the_sliced_producer_computes_and_raises_every_unit(
        standin_deep_gemm: None, granularity: str) -> None:
    from sglang_overlap.kernels.fp8 import quant_per_block, quant_per_token_group
    from sglang_overlap.kernels.signals import new_signal

    g = torch.Generator().manual_seed(3)
    e, cap, k, n = 6, 128, 256, 256
    a, a_scale = quant_per_token_group(torch.randn(e, cap, k, generator=g))
    b, b_scale = quant_per_block(torch.randn(e, n, k, generator=g))
    masked_m = torch.tensor([5, 0, 128, 64, 1, 70], dtype=torch.int32)
    out = torch.full((e, cap, n), 9.0)
    lay = plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=64, block_n=128, hidden=n,
                          num_sms=132, comm_num_sms=4, granularity=granularity)  # type: ignore
    signal = new_signal(lay, "cpu")
    plan = down_gemm.signal_down_gemm(a, a_scale, b, b_scale, out, masked_m, 64, signal=signal,
                                      layout=lay, plan=down_gemm.SignalPlan("fused"))
    assert plan == down_gemm.host_ordered_plan(e)  # the Triton kernel needs CUDA: slices serve
    assert (plan.path, plan.streams, plan.slice_experts) == ("sliced", 1, 1)
    assert [down_gemm.host_ordered_plan(x).slice_experts for x in (1, 3, 8, 9, 32)] == [
        1, 1, 2, 2, 8]  # E/4 experts per slice, one stream
    assert signal.to(torch.int64).eq(lay.expect_value).all()
    a_deq = a.float() * a_scale.repeat_interleave(128, -1)
    b_deq = b.float() * b_scale.repeat_interleave(128, 1).repeat_interleave(128, 2)
    for x, rows in enumerate(masked_m.tolist()):
        assert torch.equal(out[x, :rows], a_deq[x, :rows] @ b_deq[x].T), x
        assert out[x, rows:].eq(9.0).all(), x  # rows past masked_m untouched


def test_the_layouts_config_drops_multicast_its_n_tiles_cannot_pair() -> None:
    plan = down_gemm.SignalPlan("deepgemm", dg_config=DgSignalConfig(64, 112, 9, store_warp=True,
                                                                     multicast=2))

    def layout(hidden: int) -> object:
        return plan_sbo_layout(num_local_experts=4, capacity=128, block_m=64, block_n=112,
                               hidden=hidden, num_sms=132, comm_num_sms=4, granularity="block")
    assert dg_config_for_layout(plan, layout(7168), 2048) == plan.dg_config  # 64 n tiles
    cfg = dg_config_for_layout(plan, layout(6144), 2048)  # 55 n tiles: no pairs
    assert cfg == DgSignalConfig(64, 112, 9, store_warp=True)


@pytest.mark.parametrize(("sms", "multicast"), [(None, 2), (127, 1)])
def test_the_launch_drops_multicast_on_an_odd_sm_count(monkeypatch: pytest.MonkeyPatch,
                                                       sms: int | None, multicast: int) -> None:
    """signal_down_gemm's own SM count (`compute_num_sms`) may differ from the layout's: the
    config it launches must still be launchable there. The launch itself needs CUDA, so it is
    recorded, not run; the operands only need their shapes and a CUDA device type."""
    from types import SimpleNamespace

    from sglang_overlap.kernels import signal_deepgemm

    launched: list[tuple[DgSignalConfig, int]] = []
    monkeypatch.setattr(signal_deepgemm, "masked_gemm_signal",
                        lambda *a, config, num_sms, **kw: launched.append((config, num_sms)))
    cuda = SimpleNamespace(type="cuda")
    a = SimpleNamespace(device=cuda, shape=(4, 128, 2048))
    b = SimpleNamespace(device=cuda, shape=(4, 7168, 2048))
    lay = plan_sbo_layout(num_local_experts=4, capacity=128, block_m=64, block_n=112,
                          hidden=7168, num_sms=132, comm_num_sms=4, granularity="block")
    plan = down_gemm.SignalPlan("deepgemm", dg_config=DgSignalConfig(64, 112, 9, store_warp=True,
                                                                     multicast=2))
    scale = torch.ones(1)
    ran = down_gemm.signal_down_gemm(a, scale, b, scale, None, None, 64,  # type: ignore[arg-type]
                                     signal=None, layout=lay,  # type: ignore[arg-type]
                                     compute_num_sms=sms, plan=plan)
    assert ran.path == "deepgemm" and launched == [(ran.dg_config, sms or 128)]
    assert launched[0][0].multicast == multicast


FUSED_WHY = "the fused Triton SBO producer does not build on triton 3.3.1 (NameError)"


@pytest.mark.parametrize(("experts", "m"), [(1, 1), (8, 16), (15, 64)])
def test_where_triton_cannot_build_the_fused_producer_slices_serve(
        monkeypatch: pytest.MonkeyPatch, experts: int, m: int) -> None:
    assert choose_signal_path(experts, m, capacity=64).path == "fused"  # the table's choice
    monkeypatch.setattr(down_gemm, "_FUSED_UNAVAILABLE", [FUSED_WHY])
    plan = choose_signal_path(experts, m, capacity=64)
    assert (plan.path, plan.slice_experts, plan.streams) == ("sliced", max(1, experts // 4), 2)
    assert FUSED_WHY in plan.why and "fused" in plan.why, plan
    assert choose_signal_path(16, m, capacity=256) == down_gemm.SignalPlan(
        "sliced", 4, 2, why=choose_signal_path(16, m, capacity=256).why)  # unchanged


@pytest.mark.parametrize("capacity", [16, 96])
def test_a_capacity_only_the_fused_producer_computes_is_refused_without_it(
        monkeypatch: pytest.MonkeyPatch, capacity: int) -> None:
    monkeypatch.setattr(down_gemm, "_FUSED_UNAVAILABLE", [FUSED_WHY])
    with pytest.raises(ValueError, match=rf"capacity {capacity} .*{re.escape(FUSED_WHY)}"):
        choose_signal_path(8, 16, capacity)


@pytest.mark.parametrize(("version", "logged"), [("3.3.1", 1), ("3.8.0", 0), ("9.0.0", 1)])
def test_the_triton_verdict_is_read_once_and_logged_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, version: str,
        logged: int) -> None:
    from sglang_overlap.kernels import triton_versions

    # 9.0.0: a release that builds the slices' store but not the fused kernel
    monkeypatch.setattr(triton_versions, "CHECKED", (*triton_versions.CHECKED, (
        triton_versions.TritonCheck("9.0.0", frozenset({"sliced", "silu_quant"}), "an error"))))
    monkeypatch.setattr(down_gemm, "_FUSED_UNAVAILABLE", [])
    calls = []
    monkeypatch.setattr(down_gemm, "installed_triton", lambda: calls.append(1) or version)
    with caplog.at_level(logging.WARNING, logger=down_gemm.__name__):
        first, second = down_gemm.fused_unavailable(), down_gemm.fused_unavailable()
    assert first == second and len(calls) == 1
    assert (first is None) == (logged == 0) and (first is None or f"triton {version}" in first)
    lines = [r for r in caplog.records if "DeepGEMM slices serve" in r.getMessage()]
    assert len(lines) == logged, caplog.text
