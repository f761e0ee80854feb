"""sglang-overlap: MoE communication/computation overlap for SGLang (`compat.SUPPORTED_SGLANG`).

Layers (each imports only downward):
  planning/   pure Python: batch splits, two-chunk cuts, SBO signal layout, cost model, gate
  kernels/    torch: what the server runs, one module per kernel library
  sglang/     the glue: the only package that imports sglang

Not in the wheel: the pure-torch oracle every kernel and executor is checked against, and the
GPU harness that runs the plugin's own MoE layer on the real kernels; only the source
repository's tests and benchmarks run them.

Importing this package imports neither torch, sglang, deep_ep nor deep_gemm.
"""

__version__ = "0.1.0"
