"""What the server runs: torch code and one module per kernel library. No sglang imports; only
`deepep.py` imports deep_ep and only `deepgemm.py` imports deep_gemm (`signal_deepgemm/` reads
deep_gemm's headers from disk and never imports it).

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
    deepgemm.py          DeepGEMM calls (masked, contiguous)
    deepgemm_experts.py  the fp8 expert runner on DeepGEMM (gate-up, SiLU+quant, down GEMM)
    fp8.py               DeepGEMM's fp8 block-quant recipe, SiLU-and-mul + quant
    deepep.py            DeepEP buffer sizing, combine overlap kwargs per form, the dispatcher
    combine_overlap.py   each DeepEP tree's overlapped-combine form: kwargs, send SMs, signal
    sbo_layer.py         one MoE layer on DeepEP + DeepGEMM with SGLang's SBO schedule
    sbo_watchdog.py      bounded waits on an SBO step (a stuck signal becomes a SignalError)

Inside SGLang, the glue (`sglang_overlap.sglang`) calls capabilities, deepep's combine kwargs
(with combine_overlap), down_gemm (with signal_deepgemm / signal_fused / signal_sliced / fp8),
and for torch_a2a: a2a, contracts, experts, streams; SGLang's own layer runs the rest.
`DeepEPDispatcher`, `deepgemm_experts.py`, `sbo_layer.py` and `sbo_watchdog.py` are the plugin's
own MoE layer on the same real kernels: what the GPU tests and benchmarks run to prove those
kernels without SGLang (they ran on an H200 with torch 2.11, where sglang 0.5.23's torch 2.14
stack was not installed). The oracle all of these are checked against is
`sglang_overlap.reference`.
"""
