"""Torch engine: the MoE layer as ordered stages, the executors that run them, and one module per
kernel backend. No sglang imports here; only the backend modules import deep_ep / deep_gemm."""
