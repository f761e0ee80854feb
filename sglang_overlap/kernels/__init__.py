"""What the server runs: torch code and one module per kernel library. No sglang imports; only
`deepgemm.py` imports deep_gemm (`signal_deepgemm/` reads deep_gemm's headers from disk and
never imports it); nothing here imports deep_ep (SGLang does; `capabilities.py` reads its source).

Where things are:
    capabilities.py      what the installed deep_ep / deep_gemm accept, read without loading them
    contracts.py         Dispatcher / ExpertRunner protocols and both DeepEP layouts
    signals.py           the SBO signal contract (down GEMM marks units, combine-send takes them)
    layouts.py           packing rows into the low-latency / normal layouts, the weighted combine
    rowwise.py           batch-independent math (why overlap modes agree bit for bit on CPU)
    streams.py           compute / communication streams joined by events (in order on CPU)
    a2a.py               torch.distributed all-to-all dispatcher (gloo / NCCL, any world size)
    experts.py           the torch expert runner (valid rows only; SBO marks units as they finish)
    down_gemm.py         THE SBO down GEMM: picks the producer and its tiles per shape, runs it
    signal_deepgemm/     SignalPlan.path "deepgemm": DeepGEMM's SM90 masked kernel with the
                         signal patch of the installed release, JIT-built, driver-launched
    signal_fused.py      SignalPlan.path "fused": the Triton fp8 masked GEMM raising signals
    signal_sliced.py     SignalPlan.path "sliced": DeepGEMM per expert slice + signal stores
    triton_versions.py   which triton releases build the plugin's Triton kernels (a table)
    producers.py         which SBO producer serves here, in one line (check, start-up log)
    deepgemm.py          DeepGEMM calls (masked, contiguous)
    fp8.py               DeepGEMM's fp8 block-quant recipe, SiLU-and-mul + quant
    combine_overlap.py   each DeepEP tree's overlapped-combine form: kwargs, send SMs, signal

Inside SGLang, the glue (`sglang_overlap.sglang`) calls capabilities, combine_overlap, down_gemm
(with signal_deepgemm / signal_fused / signal_sliced / fp8), and for torch_a2a: a2a, contracts,
experts, streams; SGLang's own layer runs the rest. Not in the package: the GPU harness (the
plugin's own MoE layer on the same real kernels, with a DeepEP dispatcher and a DeepGEMM expert
runner) and the pure-torch oracle everything is checked against; only the source repository's
tests and benchmarks run them.

This package's `__init__` exports nothing: import the module that holds the entry point.
"""
