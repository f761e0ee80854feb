"""Build and load `torch_bridge.cpp` (README.md here) only where torch lacks its symbols.

    python benchmarks/gpukit/bridge.py build OUT.so   # g++ against the running torch
    python benchmarks/gpukit/bridge.py check          # which symbols torch lacks, one line

In a process: `import torch` first, then `load_if_needed()` (the `.so` named by
SGLANG_OVERLAP_TORCH_BRIDGE), then `import deep_gemm`. Benchmark and GPU-harness use only.

Loading it also installs an import hook (`RemapAfterImport`): once `deep_gemm` or `sgl_kernel`
has been imported, `bridge_remap_cuda` gives their ops CUDA kernels. Built against torch 2.14,
whose dispatch keys sit one below 2.11's (2.14 dropped `Named`), they registered their CUDA
kernels on 2.11's CPU key ("Could not run 'deep_gemm::...' with arguments from the 'CUDA'
backend"). What the remap cannot mend: code inlined from 2.14's headers that reads TensorImpl's
bit fields, whose layout changed too (sgl_kernel's `input.is_cuda()` checks read false).
"""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.machinery
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parent / "torch_bridge.cpp"
BRIDGE_ENV = "SGLANG_OVERLAP_TORCH_BRIDGE"
TORCH_LIBS = ("libc10.so", "libc10_cuda.so", "libtorch_cpu.so", "libtorch.so", "libtorch_cuda.so")


def bridge_symbols(source: Path = SOURCE) -> list[str]:
    """The symbols the bridge defines: the `__asm__` names of its `bridge_*` functions and its
    `extern "C"` functions (the `lib211_*` declarations are torch 2.11's own)."""
    text = source.read_text()
    asm = re.findall(r"\bbridge_\w+\([^;{]*?\)\s*__asm__\(\"(\w+)\"\)", text, flags=re.S)
    extern_c = re.findall(r'extern "C" [^(]*?\b(\w+)\(\)', text)
    return sorted(set(asm) | set(extern_c))


def torch_lib_dir() -> Path:
    import torch

    return Path(torch.__file__).resolve().parent / "lib"


def missing_symbols() -> list[str]:
    """The bridge's symbols that none of torch's libraries exports (loads torch)."""
    libs = [ctypes.CDLL(str(torch_lib_dir() / name)) for name in TORCH_LIBS
            if (torch_lib_dir() / name).is_file()]
    return [s for s in bridge_symbols() if not any(hasattr(lib, s) for lib in libs)]


def compiler() -> str:
    for cand in (os.environ.get("CXX"), "/opt/gcc/bin/g++", shutil.which("g++")):
        if cand and Path(cand).is_file():
            return cand
    raise RuntimeError("no g++ (set CXX): the torch bridge is built against the running torch")


def build(out: Path) -> Path:
    """g++ the bridge against the running torch's headers and libraries (README.md)."""
    import torch

    tp = Path(torch.__file__).resolve().parent
    cmd = [compiler(), "-shared", "-fPIC", "-O2", "-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=1",
           f"-I{tp}/include", f"-I{tp}/include/torch/csrc/api/include",
           "-I/usr/local/cuda/include", str(SOURCE), f"-L{tp}/lib", "-lc10", "-lc10_cuda",
           "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{tp}/lib", "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"building the torch bridge failed:\n{' '.join(cmd)}\n{proc.stderr}")
    return out


def load_if_needed(path: str | None = None) -> str:
    """Load the bridge RTLD_GLOBAL when torch lacks any of its symbols; one line saying what
    was done. Call after `import torch`, before `import deep_gemm`."""
    import torch

    missing = missing_symbols()
    if not missing:
        return f"torch {torch.__version__} exports every bridge symbol: no bridge loaded"
    path = path or os.environ.get(BRIDGE_ENV)
    if not path or not Path(path).is_file():
        return (f"torch {torch.__version__} lacks {len(missing)} symbols deep_gemm 0.2.x "
                f"imports and no bridge is built ({BRIDGE_ENV}={path!r}): its _C.so will not "
                "load")
    install(path)
    return f"torch {torch.__version__} lacks {len(missing)} symbols: loaded {path}"


REMAP = {"sgl_kernel": "sgl_kernel", "deep_gemm": "deep_gemm"}  # module -> op namespace


class RemapAfterImport(importlib.abc.MetaPathFinder):
    """After `REMAP`'s modules execute, remap their ops' CUDA kernels (module docstring)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in REMAP:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_remap(module: Any) -> None:
            exec_module(module)
            n = self.lib.bridge_remap_cuda(REMAP[name].encode())
            if os.environ.get("SGLANG_SERVE_BRIDGE_VERBOSE"):
                print(f"[bridge] {name}: {n} ops given CUDA kernels", file=sys.stderr)

        spec.loader.exec_module = exec_and_remap  # type: ignore[method-assign]
        return spec


def install(path: str) -> ctypes.CDLL:
    """Load the bridge at `path` RTLD_GLOBAL (after torch) and install the remapping hook."""
    import torch  # noqa: F401  (its libraries first: the bridge links against them)

    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    lib.bridge_remap_cuda.argtypes = [ctypes.c_char_p]
    if not any(isinstance(f, RemapAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, RemapAfterImport(lib))
    return lib


def main(argv: list[str]) -> int:
    if argv[:1] == ["build"] and len(argv) == 2:
        print(build(Path(argv[1])))
        return 0
    if argv == ["check"]:
        missing = missing_symbols()
        print(f"bridge symbols: {len(bridge_symbols())}, missing from torch: {len(missing)}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
