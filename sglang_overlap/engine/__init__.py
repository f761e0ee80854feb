"""Torch engine: the MoE layer as ordered stages, the executors that run them, and one module per
kernel backend. No sglang imports here; only the backend modules import deep_ep / deep_gemm.

Where things are:
    interfaces.py  Dispatcher / ExpertRunner protocols, both DeepEP layouts (the contracts)
    signals.py     the SBO signal contract (down GEMM marks units, combine-send waits on them)
    router.py      DeepSeek-V3 gate: sigmoid + correction bias, group-limited top-k, scaling
    stages.py      the layer as named ops with YIELD points; the decode/prefill/sbo schedules
    executors.py   serial, TBO (two-chunk = a TBO plan), SBO
    streams.py     compute/communication streams joined by events (in-order on CPU)
    layouts.py     packing rows into the low-latency / normal layouts, weighted combine
    rowwise.py     batch-independent CPU math (why executors agree bit for bit)
    reference.py   pure torch experts + local dispatcher (EP = 1)
    a2a.py         torch.distributed all-to-all dispatcher (gloo / NCCL, any world size)
    toy.py         a small random model and causal toy attention, for tests and benchmarks
    deepep.py, deepgemm.py, deepgemm_runner.py, signal_gemm.py, combine_consumer.py,
    fp8.py         kernel backends (DeepEP, DeepGEMM, the Triton signal GEMM and consumer)
"""
