"""Building the patched kernel: nvcc lookup, the translation unit per instantiation, the cubin
cache (one cubin per source, flags, compiler and patched-header folder)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from sglang_overlap.kernels.signal_deepgemm.configs import (
    BLOCK_K,
    MODE_VALUE,
    TMA_THREADS,
    DgSignalConfig,
    SignalMode,
    swizzle_mode,
)
from sglang_overlap.kernels.signal_deepgemm.versions import KERNEL_HEADER, DgSignalError, Release

# DeepGEMM's nvcc flags (csrc/jit/compiler.hpp of the same releases)
NVCC_FLAGS = ("-std=c++20", "--diag-suppress=39,161,174,177,186,940",
              "--ptxas-options=--register-usage-level=10", "--gpu-architecture=sm_90a",
              "--compiler-options=-fPIC,-O3,-fconcepts,-Wno-deprecated-declarations,-Wno-abi",
              "-O3", "--expt-relaxed-constexpr", "--expt-extended-lambda")


def nvcc_path() -> Path:
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and (Path(base) / "bin" / "nvcc").is_file():
            return Path(base) / "bin" / "nvcc"
    found = shutil.which("nvcc")
    if found is None:
        raise DgSignalError("nvcc not found (set CUDA_HOME): the patched DeepGEMM kernel is "
                            "JIT-compiled, as DeepGEMM's own kernels are")
    return Path(found)


def kernel_source(config: DgSignalConfig, *, release: Release, num_groups: int, n: int, k: int,
                  num_sms: int, mode: SignalMode, unit_m: int) -> str:
    """The translation unit that instantiates `release`'s patched kernel (shape_m stays
    dynamic). With signals off the timing means nothing: the source is the same for every
    timing."""
    if mode == "block" and config.block_m % unit_m:
        raise ValueError(f"per-block signals need block_m {config.block_m} to be a multiple of "
                         f"the signal's {unit_m} rows")
    args = ", ".join(str(x) for x in (
        0, n, k, num_groups, config.block_m, config.block_n, BLOCK_K, 128, 128,
        swizzle_mode(config.block_n), config.num_stages, TMA_THREADS, config.math_threads,
        config.multicast, _cpp_bool(config.multicast_on_a), num_sms))
    signals = mode != "none"
    return (f"#include <{KERNEL_HEADER}>\n\nusing namespace deep_gemm;\n\n"
            "static void __instantiate_kernel() {\n"
            "    auto ptr = reinterpret_cast<void*>(&sm90_fp8_gemm_1d2d_impl<\n"
            f"        cute::UMMA::Major::K, {args},\n"
            "        GemmType::MGroupedMasked, cutlass::bfloat16_t,\n"
            f"        {', '.join(release.template_tail)},\n"
            f"        {MODE_VALUE[mode]}, {unit_m}, {_cpp_bool(signals and config.eager)}, "
            f"{_cpp_bool(signals and config.store_warp)}>);\n"
            "}\n")


def _cpp_bool(value: bool) -> str:
    return "true" if value else "false"


def compile_cubin(source_text: str, include: Path) -> Path:
    """nvcc -cubin, cached under the include folder's sibling `kernels/` by a hash of the source,
    flags and compiler."""
    nvcc = nvcc_path()
    key = hashlib.sha256("\0".join((source_text, " ".join(NVCC_FLAGS), _nvcc_version(nvcc),
                                    include.parent.name)).encode()).hexdigest()[:24]
    out_dir = include.parent / "kernels"
    cubin = out_dir / f"{key}.cubin"
    if cubin.is_file():
        return cubin
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source_text)
        tmp_cubin = Path(tmp) / "kernel.cubin"
        cmd = [str(nvcc), str(src), "-cubin", "-o", str(tmp_cubin), f"-I{include}", *NVCC_FLAGS]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise DgSignalError(f"nvcc failed on the patched DeepGEMM kernel:\n"
                                f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
        os.replace(tmp_cubin, cubin)
    return cubin


_NVCC_VERSIONS: dict[Path, str] = {}


def _nvcc_version(nvcc: Path) -> str:
    if nvcc not in _NVCC_VERSIONS:
        proc = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True)
        match = re.search(r"release (\d+\.\d+), V([\d.]+)", proc.stdout)
        if proc.returncode != 0 or match is None:
            raise DgSignalError(f"{nvcc} --version failed: {proc.stdout}{proc.stderr}")
        _NVCC_VERSIONS[nvcc] = match.group(2)
    return _NVCC_VERSIONS[nvcc]

