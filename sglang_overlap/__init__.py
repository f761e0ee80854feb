"""sglang-overlap: MoE communication/computation overlap for SGLang 0.5.23.

Layers (each imports only downward):
  planning/   pure Python: batch splits, two-chunk cuts, SBO signal layout, cost model, gate
  kernels/    torch: what the server runs, one module per kernel library
  reference/  torch: the oracle the kernels and the glue are checked against (never served)
  sglang/     the glue: the only package that imports sglang

Importing this package imports neither torch, sglang, deep_ep nor deep_gemm.
"""

__version__ = "0.1.0"
