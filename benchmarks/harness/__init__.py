"""The GPU harness: the plugin's own MoE layer on DeepEP + DeepGEMM, run by tests/gpu and the
benchmarks to prove the served kernels without SGLang (sglang does not install on the GPU
machine). Never served, never shipped in the wheel.

    deepep.py            DeepEP buffer sizing, `load_deep_ep`, `HarnessDeepEPDispatcher`
    deepgemm_experts.py  the fp8 expert runner on DeepGEMM (gate-up, SiLU+quant, down GEMM)
    sbo_layer.py         one MoE layer with SGLang's SBO schedule (serial / shared / sbo)
    sbo_watchdog.py      bounded waits on an SBO step (a stuck signal becomes a SignalError)
    graph_sets.py        a stack of those layers in the decode modes none / sbo / tbo, and
                         decode graph sets captured per mode into one shared pool
"""
