"""The patched kernel's configs: DeepGEMM's SM90 tile, stage and shared-memory rules for
`sm90_fp8_gemm_1d2d_impl`, restricted to what the signal form needs (the same in every release
of `versions.RELEASES`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

BLOCK_K = 128
SMEM_CAPACITY = 232448  # SM90 dynamic shared memory per block (DeepGEMM's SM90ArchSpec)
TMA_THREADS = 128

SignalMode = Literal["none", "block", "expert"]
MODE_VALUE = {"none": 0, "block": 1, "expert": 2}


def block_n_candidates() -> tuple[int, ...]:
    """SM90 1D2D block_n values DeepGEMM allows: multiples of 16 up to 128, then 144, 160, 192
    (larger ones spill registers)."""
    return tuple(range(16, 129, 16)) + (144, 160, 192)


def swizzle_mode(block_n: int) -> int:
    """The output tile's TMA swizzle in bytes (bf16 rows of block_n)."""
    for mode in (128, 64, 32, 16):
        if block_n * 2 % mode == 0:
            return mode
    raise ValueError(f"block_n {block_n} is not a multiple of 8")


def smem_size(block_m: int, block_n: int, stages: int, k: int, signals: bool = True) -> int:
    """Dynamic shared memory of one CTA (DeepGEMM's SM90 get_smem_config for this kernel), plus
    the patch's 4 signal-handoff barriers when `signals`."""
    def align(x: int, to: int) -> int:
        return -(-x // to) * to

    cd = align(block_m * block_n * 2, 1024)
    per_stage = block_m * BLOCK_K + block_n * BLOCK_K + align(block_m * 4, 128)  # A, B, A scales
    sfb = align(-(-k // BLOCK_K) * 4 * (1 if BLOCK_K % block_n == 0 else 2), 8)  # B scales
    return cd + stages * per_stage + sfb + stages * 2 * 8 + (32 if signals else 0)  # barriers


def max_stages(block_m: int, block_n: int, k: int) -> int:
    """The most pipeline stages that fit (signal barriers included)."""
    for stages in range(32, 0, -1):
        if smem_size(block_m, block_n, stages, k) <= SMEM_CAPACITY:
            return stages
    raise ValueError(f"no stage count fits block {block_m}x{block_n} in shared memory")


@dataclass(frozen=True)
class DgSignalConfig:
    """One instantiation of the patched kernel."""

    block_m: int
    block_n: int
    num_stages: int
    eager: bool = False
    """Hand a tile to the signalling lane right after its stores (the store threads wait for
    them) instead of at the next tile's store wait (deferred: no wait on the math path)."""
    store_warp: bool = False
    """The signalling lane issues each tile's TMA stores itself and frees shared memory once they
    have read it; the math threads never wait for a global write (exclusive with `eager`)."""
    multicast: int = 1
    """CTAs of a cluster sharing one TMA load (1 or 2; DeepGEMM's kNumTMAMulticast)."""
    multicast_on_a: bool = False
    """The shared load is A's (two n tiles of one m block) instead of B's."""

    def __post_init__(self) -> None:
        if self.block_m not in (64, 128):
            raise ValueError(f"block_m must be 64 or 128 (got {self.block_m})")
        if self.block_n not in block_n_candidates():
            raise ValueError(f"block_n must be one of {block_n_candidates()} "
                             f"(got {self.block_n})")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1 (got {self.num_stages})")
        if self.multicast not in (1, 2):
            raise ValueError(f"multicast must be 1 or 2 (got {self.multicast})")
        if self.eager and self.store_warp:
            raise ValueError("eager and store_warp are two signal timings: choose one")

    def check_launch(self, n: int, num_sms: int) -> None:
        """ValueError when this config cannot run on `num_sms` SMs for output width `n`."""
        if self.multicast > 1 and (num_sms % self.multicast or -(-n // self.block_n) % 2):
            raise ValueError(f"multicast {self.multicast} needs an even SM count and an even "
                             f"number of n tiles (num_sms={num_sms}, N={n}, "
                             f"block_n={self.block_n})")

    @property
    def math_threads(self) -> int:
        return 128 if self.block_m <= 64 else 256

    @property
    def threads(self) -> int:
        return TMA_THREADS + self.math_threads

    def smem(self, k: int, signals: bool = True) -> int:
        return smem_size(self.block_m, self.block_n, self.num_stages, k, signals)


def default_config(num_groups: int, expected_m: int, capacity: int, n: int, k: int,
                   num_sms: int) -> DgSignalConfig:
    """DeepGEMM's SM90 choice for a masked GEMM: block_m 64 or 128 and a legal block_n with the
    fewest waves over `num_sms`, then the best last-wave use, then its tie rules; the most
    stages that fit. block_m 128 only where it divides the capacity (a 128-row store must not
    cross into the next expert)."""
    m = max(1, expected_m)
    best: tuple[int, int, int, int] | None = None  # block_m, block_n, waves, last-wave use
    for bm in (64, 128):
        if capacity % bm:
            continue
        for bn in block_n_candidates():
            blocks = -(-m // bm) * -(-n // bn) * num_groups
            waves = -(-blocks // num_sms)
            last = blocks % num_sms or num_sms
            if best is None or waves < best[2]:
                best = (bm, bn, waves, last)
            elif waves == best[2]:
                better = last > best[3]
                if last == best[3]:
                    better |= bm == best[0] and bn < best[1]
                    better |= bn == best[1] and bm < best[0]
                    better |= bm != best[0] and bn > best[1] and bn <= n and bm <= m
                if better:
                    best = (bm, bn, waves, last)
    if best is None:
        raise ValueError(f"capacity {capacity} is not a multiple of 64")
    return DgSignalConfig(best[0], best[1], max_stages(best[0], best[1], k))

