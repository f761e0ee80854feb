"""sglang-overlap: MoE communication/computation overlap for SGLang 0.5.23.

Layers (each imports only downward):
  planning/  pure Python: batch splits, two-chunk cuts, SBO signal layout, cost model
  engine/    torch: the MoE layer as stages, executors, one module per kernel backend
  sglang/    the glue: the only package that imports sglang

Importing this package imports neither torch, sglang, deep_ep nor deep_gemm.
"""

__version__ = "0.1.0"
