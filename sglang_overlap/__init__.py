"""sglang-overlap: MoE communication/computation overlap for SGLang 0.5.23.

Layers (each imports only downward):
  planning/   pure Python: batch splits, two-chunk cuts, SBO signal layout, cost model, gate
  kernels/    torch: what the server runs, one module per kernel library
  sglang/     the glue: the only package that imports sglang

Only tests and benchmarks run the oracle (`tests/oracle/`) and the GPU harness
(`benchmarks/harness/`); neither ships in the wheel.

Importing this package imports neither torch, sglang, deep_ep nor deep_gemm.
"""

__version__ = "0.1.0"
