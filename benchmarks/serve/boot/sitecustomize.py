"""GPU-machine boot for `benchmarks/run_gpu.sh serve` (on PYTHONPATH of the processes it starts,
nothing else), active when SGLANG_SERVE_TORCH_BRIDGE names the built bridge (benchmarks/gpukit):

* loads the bridge RTLD_GLOBAL after torch, before any torch-2.14 extension, so sgl_kernel's and
  deep_gemm's libraries find the nine symbols torch 2.11 lacks;
* once `sgl_kernel` / `deep_gemm` has been imported (an import hook: processes that never import
  them never touch CUDA), gives their ops CUDA kernels (`bridge_remap_cuda`): built against
  torch 2.14, whose dispatch keys sit one below 2.11's, they registered their CUDA kernels on
  2.11's CPU key.
"""

import importlib.abc
import importlib.machinery
import os
import sys

_bridge_path = os.environ.get("SGLANG_SERVE_TORCH_BRIDGE")
REMAP = {"sgl_kernel": "sgl_kernel", "deep_gemm": "deep_gemm"}  # module -> op namespace


class _RemapAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201
        if name not in REMAP:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_remap(module):  # noqa: ANN001, ANN202
            exec_module(module)
            n = _lib.bridge_remap_cuda(REMAP[name].encode())
            if os.environ.get("SGLANG_SERVE_BRIDGE_VERBOSE"):
                print(f"[bridge] {name}: {n} ops given CUDA kernels", file=sys.stderr)

        loader.exec_module = exec_and_remap
        return spec


if _bridge_path:
    import ctypes

    import torch  # noqa: F401  (its libraries first: the bridge links against them)

    _lib = ctypes.CDLL(_bridge_path, mode=ctypes.RTLD_GLOBAL)
    _lib.bridge_remap_cuda.argtypes = [ctypes.c_char_p]
    sys.meta_path.insert(0, _RemapAfterImport())
