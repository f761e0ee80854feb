"""GPU-machine boot for `benchmarks/run_gpu.sh serve` (on PYTHONPATH of the processes it starts,
nothing else): where SGLANG_SERVE_TORCH_BRIDGE names the built bridge, load it and its
dispatch-key remapping hook (benchmarks/gpukit/bridge.py, staged beside this file as
`sglang_serve_bridge`) before any torch-2.14 extension loads."""

import os

if os.environ.get("SGLANG_SERVE_TORCH_BRIDGE"):
    import sglang_serve_bridge

    sglang_serve_bridge.install(os.environ["SGLANG_SERVE_TORCH_BRIDGE"])
