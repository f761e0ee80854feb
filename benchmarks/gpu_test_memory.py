"""Peak GPU memory of the heaviest setups of the GPU tests, torch only (no DeepEP, no DeepGEMM):
the operands and references each test file builds at its largest shape, timed by torch's
allocator (`max_memory_allocated` / `max_memory_reserved`), each case alone.

The `gpu_mem` markers of tests/gpu/ are these peaks with headroom (the kernels' own workspaces,
the CUDA context); a GPU run with SGLANG_OVERLAP_GPU_MEM_LOG set records every test's own peak,
and a test whose peak exceeds its marker fails (tests/gpu/conftest.py).

    python benchmarks/gpu_test_memory.py [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GIB = 2**30


def _signal_gemm(e: int, cap: int, n: int, k: int) -> Callable[[], Any]:
    def run() -> Any:
        from tests.gpu.test_signal_gemm import make_case, reference

        case = make_case(0, e, cap, n, k)
        return reference(case)
    return run


def _down_gemm(groups: int, m: int, n: int, k: int) -> Callable[[], Any]:
    def run() -> Any:
        import torch

        from tests.gpu.test_signal_down_gemm import deepgemm_masked_case, fp32_reference
        from tests.gpu.test_signal_gemm import valid_rows

        case = deepgemm_masked_case(1, groups, m, n, k)
        out = torch.full((groups, case.a.shape[1], n), float("nan"), dtype=torch.bfloat16,
                         device="cuda")
        valid = valid_rows(case)
        return out, fp32_reference(case, valid)
    return run


def _dsv3(e: int, cap: int) -> Callable[[], Any]:
    def run() -> Any:
        import torch

        from tests.gpu.test_signal_down_gemm import fp32_reference
        from tests.gpu.test_signal_gemm import make_case, valid_rows

        case = make_case(7, e, cap, 7168, 2048)
        out = torch.full((e, cap, 7168), float("nan"), dtype=torch.bfloat16, device="cuda")
        return out, fp32_reference(case, valid_rows(case))
    return run


def _sbo_weights(e: int) -> Callable[[], Any]:
    def run() -> Any:
        from benchmarks.harness.sbo_layer import MoeShape, MoeWeights

        return MoeWeights.random(MoeShape(num_experts=e), seed=e)
    return run


CASES: dict[str, Callable[[], Any]] = {
    "test_deepgemm_signal E32 C256 N4096 K7168 (fp64 reference)": _signal_gemm(32, 256, 4096, 7168),
    "test_deepgemm_signal E32 C256 N7168 K2048 (fp64 reference)": _signal_gemm(32, 256, 7168, 2048),
    "test_signal_gemm E12 C256 N3072 K1024 (fp64 reference)": _signal_gemm(12, 256, 3072, 1024),
    "test_signal_down_gemm 32 groups C4096 N6144 K7168 (fp32 reference)": _down_gemm(32, 192, 6144,
                                                                                     7168),
    "test_signal_down_gemm 32 groups C4096 N7168 K3072 (fp32 reference)": _down_gemm(32, 192, 7168,
                                                                                     3072),
    "test_signal_down_gemm / test_dg_own_launch E32 C256 DSV3 (fp32 reference)": _dsv3(32, 256),
    "test_sbo_layer weights E32 (DeepSeek-V3 sizes)": _sbo_weights(32),
}


def measure(fn: Callable[[], Any]) -> dict[str, float]:
    import torch

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    kept = fn()
    torch.cuda.synchronize()
    out = {"allocated_gib": torch.cuda.max_memory_allocated() / GIB,
           "reserved_gib": torch.cuda.max_memory_reserved() / GIB}
    del kept
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_test_memory.py needs a CUDA GPU", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                               "total_gib": torch.cuda.mem_get_info()[1] / GIB, "cases": {}}
    for name, fn in CASES.items():
        results["cases"][name] = row = measure(fn)
        print(f"{row['allocated_gib']:7.2f} GiB allocated {row['reserved_gib']:7.2f} GiB reserved"
              f"  {name}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
