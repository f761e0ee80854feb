"""kernels/signal_deepgemm/configs.py: DeepGEMM's SM90 tile, stage and shared-memory rules."""

from __future__ import annotations

import pytest

from sglang_overlap.kernels.signal_deepgemm import configs as ds


@pytest.mark.parametrize(("e", "m", "cap", "want"), [
    (8, 64, 256, (64, 160)),  # 360 tiles: 3 waves of 132, the fullest last wave
    (8, 128, 128, (128, 160)),
    (8, 128, 192, (64, 192)),  # 128-row tiles would cross into the next expert
    (32, 16, 64, (64, 192)),
])
def test_default_config_follows_the_wave_rule(e: int, m: int, cap: int,
                                              want: tuple[int, int]) -> None:
    cfg = ds.default_config(e, m, cap, 7168, 2048, 132)
    assert (cfg.block_m, cfg.block_n) == want
    assert cfg.num_stages == ds.max_stages(*want, 2048)


def test_smem_matches_the_kernel_layout() -> None:
    # 64x112, 9 stages, K 2048: D 14336 + 9 x (A 8192 + B 14336 + A scales 256) + B scales 128
    # (two rows: 112 does not divide 128) + 18 pipeline barriers + 4 signal barriers
    assert ds.smem_size(64, 112, 9, 2048, signals=False) == 14336 + 9 * 22784 + 128 + 144
    assert ds.smem_size(64, 112, 9, 2048) == ds.smem_size(64, 112, 9, 2048, False) + 32
    for bm in (64, 128):
        for bn in ds.block_n_candidates():
            stages = ds.max_stages(bm, bn, 2048)
            assert ds.smem_size(bm, bn, stages, 2048) <= ds.SMEM_CAPACITY
            assert ds.smem_size(bm, bn, stages + 1, 2048) > ds.SMEM_CAPACITY or stages == 32


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="block_m must be 64 or 128"):
        ds.DgSignalConfig(32, 128, 4)
    with pytest.raises(ValueError, match="block_n must be one of"):
        ds.DgSignalConfig(64, 176, 4)
    with pytest.raises(ValueError, match="multicast must be 1 or 2"):
        ds.DgSignalConfig(64, 128, 4, multicast=4)
    with pytest.raises(ValueError, match="eager and store_warp are two signal timings"):
        ds.DgSignalConfig(64, 128, 4, eager=True, store_warp=True)
    ds.DgSignalConfig(64, 112, 9, multicast=2).check_launch(7168, 132)  # 64 n tiles
    with pytest.raises(ValueError, match="even number of n tiles"):
        ds.DgSignalConfig(64, 160, 7, multicast=2).check_launch(7168, 132)  # 45 n tiles
    with pytest.raises(ValueError, match="even SM count"):
        ds.DgSignalConfig(64, 128, 8, multicast=2).check_launch(7168, 129)
