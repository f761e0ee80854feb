"""The oracle: a pure-torch MoE layer as ordered stages and the executors that run it serially, as
two interleaved micro-batches (TBO, two-chunk) or as one batch with SBO signals.

Tests and benchmarks check the served kernels (`sglang_overlap.kernels`) and the glue against it.
SGLang never runs it, and `sglang_overlap.sglang` never imports it.
"""
