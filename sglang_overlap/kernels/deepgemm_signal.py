"""DeepGEMM's own SM90 masked fp8 GEMM, raising the SBO signals: route 1 of the signal producers.

No released DeepGEMM signals from its Hopper masked GEMM, and its host API takes no signal
argument. This module builds the kernel itself from the *installed* deep_gemm's headers:

1. it copies `deep_gemm/include` (DeepGEMM's own headers plus the CUTLASS / CuTe it ships) into
   a private cache folder and applies `patches/deep_gemm/<version>/...patch` there (the installed
   wheel stays untouched). The patch adds to `sm90_fp8_gemm_1d2d_impl` an `int* signal`
   argument and three template parameters: after each output tile's TMA store has completed
   (`cp.async.bulk.wait_group 0`, not only its shared-memory reads), one store thread adds 1 with
   a gpu-scope release to the tile's unit - per (expert, 64-row block) or per expert - and at
   start an idle TMA warp credits the units of the blocks past `masked_m` that the masked
   scheduler never visits, so every unit reaches its final value exactly once;
2. it JIT-compiles one instantiation per (shape, config) with nvcc and DeepGEMM's own flags,
   caches the cubin on disk, and launches it through the CUDA driver (ctypes on libcuda: TMA
   descriptors, module load, launch on the current torch stream; CUDA graphs capture it).

The patch names the exact deep_gemm version and header it applies to (`PATCHES`); any other
version, a changed header or no nvcc makes `probe()` say why, and `down_gemm` then serves the
Triton producer with one log line. No deep_gemm import happens here: only its files are read.

Signal timing (`DgSignalConfig.eager`, `.store_warp`): deferred (default) signals a tile when the
next tile of the same CTA waits for its stores anyway (or after the CTA's last tile), so the GEMM
never stalls for a signal, though that wait becomes one for the global writes, not only for the
shared-memory reads; eager waits for each tile's stores right after issuing them (one warp
stalls); store_warp lets the signalling lane issue the tile's TMA stores itself, so the math
threads wait only for the shared-memory reads (as in DeepGEMM) and the global-write wait moves
off the math path.

Legend: E local experts, C capacity rows per expert, K reduction dim, N output dim (hidden).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

    from sglang_overlap.planning.sbo_layout import SboLayout

log = logging.getLogger(__name__)

BLOCK_K = 128
SMEM_CAPACITY = 232448  # SM90 dynamic shared memory per block (DeepGEMM's SM90ArchSpec)
TMA_THREADS = 128
KERNEL_HEADER = "deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh"
PATCH_DIR = Path(__file__).resolve().parent / "deepgemm_patches"  # -> patches/deep_gemm
CACHE_ENV = "SGLANG_OVERLAP_CACHE"
# DeepGEMM's nvcc flags (csrc/jit/compiler.hpp of the same release)
NVCC_FLAGS = ("-std=c++20", "--diag-suppress=39,161,174,177,186,940",
              "--ptxas-options=--register-usage-level=10", "--gpu-architecture=sm_90a",
              "--compiler-options=-fPIC,-O3,-fconcepts,-Wno-deprecated-declarations,-Wno-abi",
              "-O3", "--expt-relaxed-constexpr", "--expt-extended-lambda")


@dataclass(frozen=True)
class PatchSpec:
    """One deep_gemm release the signal patch is made for."""

    version: str
    patch: str  # file under patches/deep_gemm/<version>/
    header_sha256: str  # of KERNEL_HEADER as that release ships it


PATCHES = {
    "0.1.4.post1": PatchSpec(
        "0.1.4.post1", "sm90_fp8_gemm_1d2d.signal.patch",
        "8667552aeb0f56be360bf71bcaeacd1d252cfc0cd12a7c555ae747e68bb64e8d"),
}


class DgSignalError(RuntimeError):
    """The patched DeepGEMM producer cannot run here (says why)."""


# ---------------------------------------------------------------------------------------------
# Locating and patching the installed headers


@dataclass(frozen=True)
class Source:
    """The installed deep_gemm headers the kernel is built from."""

    version: str
    include: Path  # deep_gemm/include of the installed package
    spec: PatchSpec


def locate(search_path: list[str] | None = None) -> Source:
    """The installed deep_gemm's headers, if the signal patch covers them; DgSignalError naming
    the version (and what is covered) otherwise. Reads files only (no import)."""
    from sglang_overlap.kernels.capabilities import package_dir, package_version

    root = package_dir("deep_gemm", search_path)
    if root is None:
        raise DgSignalError("deep_gemm is not installed")
    version = package_version("deep_gemm", search_path) or _read_version(root)
    spec = PATCHES.get(version or "")
    if spec is None:
        raise DgSignalError(f"deep_gemm {version}: the SBO signal patch covers only "
                            f"{', '.join(PATCHES)} (patches/deep_gemm/)")
    header = root / "include" / KERNEL_HEADER
    if not header.is_file():
        raise DgSignalError(f"deep_gemm {version} has no {KERNEL_HEADER} under {root}/include")
    digest = hashlib.sha256(header.read_bytes()).hexdigest()
    if digest != spec.header_sha256:
        raise DgSignalError(f"deep_gemm {version}'s {KERNEL_HEADER} is not the one the signal "
                            f"patch was made for (sha256 {digest[:12]} != "
                            f"{spec.header_sha256[:12]})")
    return Source(version, root / "include", spec)


def _read_version(root: Path) -> str | None:
    path = root / "VERSION"
    return path.read_text().strip() if path.is_file() else None


def patch_text(spec: PatchSpec) -> str:
    path = PATCH_DIR / spec.version / spec.patch
    if not path.is_file():
        raise DgSignalError(f"the signal patch {path} is missing from this install")
    return path.read_text()


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def apply_patch(original: str, patch: str) -> str:
    """Apply a one-file unified diff strictly: every hunk must match at its stated line, with no
    fuzz and no search (the header's hash was checked first). ValueError names the hunk."""
    lines = original.splitlines(keepends=True)
    out: list[str] = []
    pos = 0  # next unconsumed line of `lines`
    hunks = 0
    plines = patch.splitlines(keepends=True)
    i = 0
    while i < len(plines):
        match = _HUNK.match(plines[i])
        if match is None:
            i += 1
            continue
        hunks += 1
        start = int(match.group(1)) - 1 if match.group(2) != "0" else int(match.group(1))
        if start < pos:
            raise ValueError(f"patch hunk {hunks} overlaps the previous one")
        out.extend(lines[pos:start])
        pos = start
        i += 1
        while i < len(plines) and not plines[i].startswith("@@"):
            tag, body = plines[i][:1], plines[i][1:]
            if tag in (" ", "-"):
                if pos >= len(lines) or _strip_eol(lines[pos]) != _strip_eol(body):
                    raise ValueError(f"patch hunk {hunks} does not match line {pos + 1}: "
                                     f"expected {body.rstrip()!r}")
                if tag == " ":
                    out.append(lines[pos])
                pos += 1
            elif tag == "+":
                out.append(body if body.endswith("\n") else body + "\n")
            elif tag != "\\":  # "\ No newline at end of file"
                break
            i += 1
    if not hunks:
        raise ValueError("the patch has no hunk")
    out.extend(lines[pos:])
    return "".join(out)


def _strip_eol(line: str) -> str:
    return line.rstrip("\r\n")


def cache_root() -> Path:
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sglang-overlap")
    return Path(base) / "deepgemm-signal"


def prepared_include(source: Source) -> Path:
    """A private copy of `source.include` with the patch applied (built once, atomically)."""
    patch = patch_text(source.spec)
    key = hashlib.sha256((source.spec.header_sha256 + patch).encode()).hexdigest()[:16]
    target = cache_root() / f"{source.version}-{key}" / "include"
    if (target / KERNEL_HEADER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="include.", dir=target.parent))
    shutil.copytree(source.include, staging, dirs_exist_ok=True)
    header = staging / KERNEL_HEADER
    header.write_text(apply_patch(header.read_text(), patch))
    try:
        staging.rename(target)
    except OSError:  # another process won the race: theirs is the same
        shutil.rmtree(staging, ignore_errors=True)
    return target


def nvcc_path() -> Path:
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and (Path(base) / "bin" / "nvcc").is_file():
            return Path(base) / "bin" / "nvcc"
    found = shutil.which("nvcc")
    if found is None:
        raise DgSignalError("nvcc not found (set CUDA_HOME): the patched DeepGEMM kernel is "
                            "JIT-compiled, as DeepGEMM's own kernels are")
    return Path(found)


def probe() -> str | None:
    """None when the patched producer can be built here, else one line saying why not (a CUDA
    device is not needed to answer)."""
    try:
        source = locate()
        patch_text(source.spec)
        nvcc_path()
    except DgSignalError as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------------------------------------
# Configs (DeepGEMM's SM90 heuristics, restricted to what the signal form needs)


SignalMode = Literal["none", "block", "expert"]
_MODE_VALUE = {"none": 0, "block": 1, "expert": 2}


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


# ---------------------------------------------------------------------------------------------
# Kernel source, compile, load


def kernel_source(config: DgSignalConfig, *, num_groups: int, n: int, k: int, num_sms: int,
                  mode: SignalMode, unit_m: int) -> str:
    """The translation unit that instantiates the patched kernel (shape_m stays dynamic). With
    signals off the timing means nothing: the source is the same for every timing."""
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
            "        epilogue::transform::EpilogueIdentity,\n"
            f"        {_MODE_VALUE[mode]}, {unit_m}, {_cpp_bool(signals and config.eager)}, "
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


class _ClusterDim(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _LaunchAttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("cluster_dim", _ClusterDim)]


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                ("value", _LaunchAttributeValue)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION


class _Driver:
    """The few CUDA driver calls the launch needs, through ctypes (no extra dependency)."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise DgSignalError(f"libcuda.so.1 cannot be loaded: {exc}") from exc
        lib, vp, u32, u64 = self.lib, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64
        sig = {
            "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
            "cuModuleLoadData": [ctypes.POINTER(vp), ctypes.c_char_p],
            "cuModuleGetFunctionCount": [ctypes.POINTER(ctypes.c_uint), vp],
            "cuModuleEnumerateFunctions": [ctypes.POINTER(vp), ctypes.c_uint, vp],
            "cuFuncSetAttribute": [vp, ctypes.c_int, ctypes.c_int],
            "cuTensorMapEncodeTiled": [vp, ctypes.c_int, u32, vp, ctypes.POINTER(u64),
                                       ctypes.POINTER(u64), ctypes.POINTER(u32),
                                       ctypes.POINTER(u32), ctypes.c_int, ctypes.c_int,
                                       ctypes.c_int, ctypes.c_int],
            "cuLaunchKernel": [vp, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                               ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, vp,
                               ctypes.POINTER(vp), ctypes.POINTER(vp)],
            "cuLaunchKernelEx": [ctypes.POINTER(_LaunchConfig), vp, ctypes.POINTER(vp),
                                 ctypes.POINTER(vp)],
        }
        for name, argtypes in sig.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int

    def check(self, result: int, what: str) -> None:
        if result != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(result, ctypes.byref(text))
            raise DgSignalError(f"{what} failed: CUDA error {result} "
                                f"({(text.value or b'?').decode()})")

    def launch(self, func: int, grid: int, block: int, smem: int, stream: int, cluster: int,
               params: ctypes.Array[ctypes.c_void_p]) -> None:
        if cluster == 1:
            self.check(self.lib.cuLaunchKernel(func, grid, 1, 1, block, 1, 1, smem,
                                               ctypes.c_void_p(stream), params, None),
                       "cuLaunchKernel(patched DeepGEMM masked GEMM)")
            return
        attr = _LaunchAttribute(id=_CLUSTER_DIMENSION)
        attr.value.cluster_dim = _ClusterDim(cluster, 1, 1)
        config = _LaunchConfig((ctypes.c_uint * 3)(grid, 1, 1), (ctypes.c_uint * 3)(block, 1, 1),
                               smem, ctypes.c_void_p(stream), ctypes.pointer(attr), 1)
        self.check(self.lib.cuLaunchKernelEx(ctypes.byref(config), func, params, None),
                   f"cuLaunchKernelEx(patched DeepGEMM masked GEMM, cluster {cluster})")

    def load_kernel(self, cubin: bytes, smem: int) -> int:
        module = ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
        count = ctypes.c_uint()
        self.check(self.lib.cuModuleGetFunctionCount(ctypes.byref(count), module),
                   "cuModuleGetFunctionCount")
        if count.value != 1:
            raise DgSignalError(f"the patched kernel's module holds {count.value} functions, "
                                "not 1")
        func = ctypes.c_void_p()
        self.check(self.lib.cuModuleEnumerateFunctions(ctypes.byref(func), 1, module),
                   "cuModuleEnumerateFunctions")
        self.check(self.lib.cuFuncSetAttribute(func, 8, smem),  # MAX_DYNAMIC_SHARED_SIZE_BYTES
                   "cuFuncSetAttribute(max dynamic shared memory)")
        return int(func.value or 0)


class _TensorMap:
    """A CUtensorMap (128 opaque bytes) at a 64-byte aligned address, as the driver requires."""

    def __init__(self) -> None:
        self._raw = (ctypes.c_uint8 * 192)()
        base = ctypes.addressof(self._raw)
        self.address = base + (-base) % 64


_UINT8, _FLOAT32, _BFLOAT16 = 0, 7, 9
_SWIZZLE = {0: 0, 16: 0, 32: 1, 64: 2, 128: 3}
_L2_256B = 3


def _tensor_map(drv: _Driver, ptr: int, dtype: int, elem: int, inner: int, outer: int,
                outer_stride: int, box_inner: int, box_outer: int, swizzle: int) -> _TensorMap:
    """A 2D TMA descriptor (DeepGEMM's make_tma_2d_desc): dims (inner, outer), row stride in
    elements, box (box_inner, box_outer); with a swizzle the box's inner size is swizzle bytes."""
    if swizzle:
        box_inner = swizzle // elem
    tmap = _TensorMap()
    dims = (ctypes.c_uint64 * 2)(inner, outer)
    strides = (ctypes.c_uint64 * 1)(outer_stride * elem)
    box = (ctypes.c_uint32 * 2)(box_inner, box_outer)
    estr = (ctypes.c_uint32 * 2)(1, 1)
    drv.check(drv.lib.cuTensorMapEncodeTiled(tmap.address, dtype, 2, ptr, dims, strides,
                                             box, estr, 0, _SWIZZLE[swizzle], _L2_256B, 0),
              f"cuTensorMapEncodeTiled(dims={inner}x{outer}, box={box_inner}x{box_outer})")
    return tmap


_DRIVER: _Driver | None = None
_FUNCS: dict[tuple[object, ...], int] = {}
_INCLUDE: Path | None = None


def _driver() -> _Driver:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = _Driver()
    return _DRIVER


def _include() -> Path:
    global _INCLUDE
    if _INCLUDE is None:
        _INCLUDE = prepared_include(locate())
    return _INCLUDE


def kernel(config: DgSignalConfig, *, device: int, num_groups: int, n: int, k: int,
           num_sms: int, mode: SignalMode, unit_m: int) -> int:
    """The loaded CUfunction for this instantiation (compiled and loaded once per process)."""
    key = (device, config, num_groups, n, k, num_sms, mode, unit_m)
    func = _FUNCS.get(key)
    if func is None:
        text = kernel_source(config, num_groups=num_groups, n=n, k=k, num_sms=num_sms,
                             mode=mode, unit_m=unit_m)
        cubin = compile_cubin(text, _include())
        func = _driver().load_kernel(cubin.read_bytes(), config.smem(k, mode != "none"))
        _FUNCS[key] = func
    return func


def device_index(device: torch.device | int) -> int:
    """A CUDA device's index (the current device for a bare `cuda`)."""
    import torch

    if isinstance(device, int):
        return device
    return device.index if device.index is not None else torch.cuda.current_device()


def load(config: DgSignalConfig, layout: SboLayout | None, *, num_groups: int, n: int, k: int,
         num_sms: int, device: torch.device | int) -> int:
    """The CUfunction counting `layout`'s units (None: signals off), compiled and loaded on
    `device` once per process. Loading a module waits for the device to go idle: call this
    before a combine send can spin on the signal (`down_gemm.prepare_signal_down_gemm`)."""
    import torch

    mode, unit_m = layout_mode(layout, config, n)
    index = device_index(device)
    with torch.cuda.device(index):
        return kernel(config, device=index, num_groups=num_groups, n=n, k=k, num_sms=num_sms,
                      mode=mode, unit_m=unit_m)


# ---------------------------------------------------------------------------------------------
# The launch


def check_operands(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor,
                   b_scale: torch.Tensor, out: torch.Tensor, masked_m: torch.Tensor,
                   config: DgSignalConfig) -> tuple[int, int, int, int]:
    """(E, C, N, K) of `[E, C, K] x [E, N, K] -> [E, C, N]`; ValueError naming what is off.
    `a_scale` may have any strides (`mn_major_scales` re-lays it out)."""
    import torch

    if a.dim() != 3 or b.dim() != 3 or out.dim() != 3:
        raise ValueError(f"need a [E, C, K], b [E, N, K], out [E, C, N] (got {tuple(a.shape)}, "
                         f"{tuple(b.shape)}, {tuple(out.shape)})")
    e, c, k = a.shape
    n = b.shape[1]
    if b.shape != (e, n, k) or out.shape != (e, c, n):
        raise ValueError(f"shapes do not match [E, C, K] x [E, N, K] -> [E, C, N] (got "
                         f"{tuple(a.shape)}, {tuple(b.shape)}, {tuple(out.shape)})")
    if k % BLOCK_K or n % 16:
        raise ValueError(f"need K % 128 == 0 and N % 16 == 0 (got K={k}, N={n})")
    if c % config.block_m:
        raise ValueError(f"capacity {c} is not a multiple of block_m {config.block_m}: a tile's "
                         "store would cross into the next expert")
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise ValueError(f"a and b must be float8_e4m3fn (got {a.dtype}, {b.dtype})")
    if out.dtype != torch.bfloat16:
        raise ValueError(f"out must be bfloat16 (got {out.dtype})")
    if not (a.is_contiguous() and b.is_contiguous() and out.is_contiguous()):
        raise ValueError("a, b and out must be contiguous")
    if a_scale.dtype != torch.float32 or b_scale.dtype != torch.float32:
        raise ValueError(f"scales must be float32 (got {a_scale.dtype}, {b_scale.dtype})")
    groups = k // BLOCK_K
    if a_scale.shape != (e, c, groups):
        raise ValueError(f"a_scale must be [E, C, K/128] = {(e, c, groups)} (got "
                         f"{tuple(a_scale.shape)})")
    if b_scale.shape != (e, -(-n // BLOCK_K), groups) or not b_scale.is_contiguous():
        raise ValueError(f"b_scale must be a contiguous [E, ceil(N/128), K/128] = "
                         f"{(e, -(-n // BLOCK_K), groups)} (got {tuple(b_scale.shape)})")
    if masked_m.shape != (e,) or masked_m.dtype != torch.int32:
        raise ValueError(f"masked_m must be int32 [E] = ({e},) (got {masked_m.dtype} "
                         f"{tuple(masked_m.shape)})")
    for name, t in (("a", a), ("a_scale", a_scale), ("b", b), ("b_scale", b_scale),
                    ("out", out), ("masked_m", masked_m)):
        if t.device != a.device or t.device.type != "cuda":
            raise ValueError(f"{name} must be on a's CUDA device (got {t.device})")
    return e, c, n, k


def mn_major_scales(a_scale: torch.Tensor) -> torch.Tensor:
    """`a_scale` `[E, C, G]` in the layout the kernel's TMA reads: C contiguous, padded to 4
    rows (DeepGEMM's MN-major TMA-aligned layout; `fp8.silu_and_mul_quant` writes it so). Other
    strides are copied into it (one small kernel), as DeepGEMM itself does."""
    from sglang_overlap.kernels.fp8 import empty_mn_major_scales, tma_aligned_rows

    e, c, groups = a_scale.shape
    aligned = tma_aligned_rows(c)
    if a_scale.stride() == (groups * aligned, 1, aligned):
        return a_scale
    return empty_mn_major_scales((e,), c, groups, a_scale.device).copy_(a_scale)


def layout_mode(layout: SboLayout | None, config: DgSignalConfig, n: int) -> tuple[SignalMode,
                                                                                 int]:
    """(mode, unit rows) of the kernel for `layout`; ValueError when the layout's final value
    is not what this config's tiles produce."""
    if layout is None:
        return "none", 64
    if layout.block_n != config.block_n or layout.n_tiles != -(-n // config.block_n):
        raise ValueError(f"the SBO layout counts tiles of {layout.block_n} columns, the kernel "
                         f"runs block_n {config.block_n}: lay the signal out with "
                         "down_gemm's plan")
    if layout.granularity == "block":
        if config.block_m % layout.block_m:
            raise ValueError(f"per-block signals of {layout.block_m} rows need block_m a "
                             f"multiple of it (got {config.block_m})")
        return "block", layout.block_m
    if layout.block_m != config.block_m:
        raise ValueError(f"the per-expert layout counts {layout.block_m}-row blocks, the "
                         f"kernel runs block_m {config.block_m}")
    return "expert", 64


def masked_gemm_signal(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor,
                       b_scale: torch.Tensor, out: torch.Tensor, masked_m: torch.Tensor, *,
                       config: DgSignalConfig, num_sms: int, signal: torch.Tensor | None = None,
                       layout: SboLayout | None = None) -> None:
    """out[e, :masked_m[e]] = a[e] @ b[e]^T (fp8, 1x128 / 128x128 fp32 scales), DeepGEMM's SM90
    kernel on `num_sms` SMs (a persistent grid: the rest stay free for the combine send). With
    `signal` (zeroed, `signal_gemm.new_signal(layout)`), every unit reaches
    `layout.expect_value` exactly once, after the rows it covers are in memory. Rows past
    masked_m inside a written block hold garbage (as with DeepGEMM); later blocks are untouched.
    """
    import torch

    e, c, n, k = check_operands(a, a_scale, b, b_scale, out, masked_m, config)
    if signal is not None and layout is not None:
        if tuple(signal.shape) != layout.signal_shape or signal.device != a.device:
            raise ValueError(f"signal must be {layout.signal_shape} on {a.device} (got "
                             f"{tuple(signal.shape)} on {signal.device})")
        if layout.num_local_experts != e or layout.capacity != c:
            raise ValueError(f"the SBO layout is for E={layout.num_local_experts}, "
                             f"C={layout.capacity}; the GEMM has E={e}, C={c}")
    elif signal is not None or layout is not None:
        raise ValueError("signal and layout go together")
    if num_sms < 1:
        raise ValueError(f"num_sms must be >= 1 (got {num_sms})")
    config.check_launch(n, num_sms)
    a_scale = mn_major_scales(a_scale)
    func = load(config, layout, num_groups=e, n=n, k=k, num_sms=num_sms, device=a.device)
    device = device_index(a.device)
    with torch.cuda.device(device):
        drv = _driver()
        aligned = a_scale.stride(-1)
        maps = (
            _tensor_map(drv, a.data_ptr(), _UINT8, 1, k, c * e, k, BLOCK_K, config.block_m, 128),
            _tensor_map(drv, b.data_ptr(), _UINT8, 1, k, n * e, k, BLOCK_K, config.block_n, 128),
            _tensor_map(drv, out.data_ptr(), _BFLOAT16, 2, n, c * e, n, config.block_n,
                        config.block_m, swizzle_mode(config.block_n)),
            _tensor_map(drv, a_scale.data_ptr(), _FLOAT32, 4, aligned, (k // BLOCK_K) * e,
                        aligned, config.block_m, 1, 0),
        )
        scalars = [ctypes.c_void_p(b_scale.data_ptr()), ctypes.c_void_p(masked_m.data_ptr()),
                   ctypes.c_void_p(signal.data_ptr() if signal is not None else 0),
                   ctypes.c_uint32(c), ctypes.c_uint32(n), ctypes.c_uint32(k)]
        params = (ctypes.c_void_p * (len(scalars) + len(maps)))(
            *[ctypes.addressof(v) for v in scalars], *[m.address for m in maps])
        drv.launch(func, num_sms, config.threads, config.smem(k, layout is not None),
                   torch.cuda.current_stream(device).cuda_stream, config.multicast, params)
