"""GPU-machine boot for `benchmarks/run_gpu.sh serve` (on PYTHONPATH of the SGLang processes it
starts, nothing else): load the torch 2.11 bridge (benchmarks/gpukit) RTLD_GLOBAL after torch and
before any torch-2.14 extension (sgl_kernel, deep_gem) loads. Off unless SGLANG_SERVE_TORCH_BRIDGE
names the built library."""

import os

_bridge = os.environ.get("SGLANG_SERVE_TORCH_BRIDGE")
if _bridge:
    import ctypes

    import torch  # noqa: F401  (its libraries first: the bridge links against them)

    ctypes.CDLL(_bridge, mode=ctypes.RTLD_GLOBAL)
