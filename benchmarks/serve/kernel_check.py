"""Do SGLang 0.5.23's kernels behave on the staged stack (torch 2.14.1, benchmarks/serve/stage.sh)?
A few sglang-kernel ops and DeepGEMM 0.2.3.post2's GEMMs against torch references on fresh random
inputs, and one bad call each that must raise a Python error, not abort the process.

    python3 benchmarks/serve/kernel_check.py [--json OUT.json]

Inputs are quantised by the plugin's own `kernels/fp8.py` (DeepGEMM's 1x128 / 128x128 recipe);
references dequantise them with the oracle's inverses (`tests/oracle/fp8.py`), independent of
the kernels checked. Every check runs in its own process, all at once; prints one line per check
(relative error ||out - ref|| / ||ref||, its bound) and exits 1 if any fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import torch

Check = Callable[[], tuple[float, float]]
FP8 = torch.float8_e4m3fn


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all(), "non-finite output"
    return float((out - ref).norm() / ref.norm())


def quant_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (row, 128-column group) fp8: x [..., K] -> ([..., K] e4m3, [..., K/128] fp32)."""
    from sglang_overlap.kernels.fp8 import quant_per_token_group

    return quant_per_token_group(x)


def quant_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 128x128 block fp8: w [E, N, K] or [N, K] -> (e4m3, [(E,) N/128, K/128] fp32)."""
    from sglang_overlap.kernels.fp8 import quant_per_block

    if w.dim() == 2:
        q, s = quant_per_block(w[None])
        return q[0], s[0]
    return quant_per_block(w)


def deq_rows(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    from tests.oracle.fp8 import dequant_per_token_group

    return dequant_per_token_group(q, s, torch.float32)


def deq_blocks(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    from tests.oracle.fp8 import dequant_per_block

    if q.dim() == 2:
        return dequant_per_block(q[None], s[None], torch.float32)[0]
    return dequant_per_block(q, s, torch.float32)


def rmsnorm() -> tuple[float, float]:
    import sgl_kernel

    x = torch.randn(37, 7168, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(7168, device="cuda", dtype=torch.bfloat16) + 0.5
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)) * w.float()
    return rel(sgl_kernel.rmsnorm(x, w, 1e-6), ref), 1e-2


def fused_add_rmsnorm() -> tuple[float, float]:
    import sgl_kernel

    x = torch.randn(19, 7168, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.rand(7168, device="cuda", dtype=torch.bfloat16) + 0.5
    h = x.float() + r.float()
    ref = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    sgl_kernel.fused_add_rmsnorm(x, r, w, 1e-6)  # in place: x <- norm(x + r), r <- x + r
    return max(rel(x, ref), rel(r, h)), 1e-2


def silu_and_mul() -> tuple[float, float]:
    import sgl_kernel

    x = torch.randn(23, 2 * 2048, device="cuda", dtype=torch.bfloat16)
    g, u = x.float().chunk(2, -1)
    return rel(sgl_kernel.silu_and_mul(x), torch.nn.functional.silu(g) * u), 1e-2


def per_token_group_quant() -> tuple[float, float]:
    import sgl_kernel

    x = torch.randn(29, 7168, device="cuda", dtype=torch.bfloat16)
    q = torch.empty_like(x, dtype=FP8)
    s = torch.empty(29, 7168 // 128, device="cuda", dtype=torch.float32)
    sgl_kernel.sgl_per_token_group_quant_fp8(x, q, s, 128, 1e-10, -448.0, 448.0, False)
    return rel(deq_rows(q, s), x.float()), 6e-2


def dg_gemm() -> tuple[float, float]:
    import deep_gemm

    m, n, k = 77, 4096, 7168
    a, sa = quant_rows(torch.randn(m, k, device="cuda"))
    b, sb = quant_blocks(torch.randn(n, k, device="cuda"))
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    deep_gemm.fp8_gemm_nt((a, sa), (b, sb), d)
    return rel(d, deq_rows(a, sa) @ deq_blocks(b, sb).T), 1e-2


def dg_masked() -> tuple[float, float]:
    import deep_gemm

    g, m, n, k = 8, 64, 7168, 2048
    a, sa = quant_rows(torch.randn(g, m, k, device="cuda"))
    b, sb = quant_blocks(torch.randn(g, n, k, device="cuda"))
    masked = torch.randint(1, m + 1, (g,), device="cuda", dtype=torch.int32)
    d = torch.full((g, m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    deep_gemm.fp8_m_grouped_gemm_nt_masked((a, sa), (b, sb), d, masked, 32)
    ref = torch.einsum("gmk,gnk->gmn", deq_rows(a, sa), deq_blocks(b, sb))
    err = max(rel(d[i, : int(masked[i])], ref[i, : int(masked[i])]) for i in range(g))
    return err, 1e-2


def raises(fn: Callable[[], object], good: Check) -> Check:
    """A bad call must raise a Python error from the kernel's own argument check, after a good
    call of the same library passed in this process (so a library that fails every call, e.g.
    with no GPU, does not pass)."""
    def check() -> tuple[float, float]:
        err, bound = good()
        if not err <= bound:
            return 1.0, 0.0
        try:
            fn()
        except (RuntimeError, ValueError, TypeError) as exc:  # the kernel's own check
            return (1.0, 0.0) if "Could not run" in str(exc) else (0.0, 1.0)
        return 1.0, 0.0  # no error: fails

    return check


def _bad_rmsnorm() -> None:
    import sgl_kernel

    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    sgl_kernel.rmsnorm(x, torch.ones(32, device="cuda", dtype=torch.bfloat16), 1e-6)


def _bad_dg() -> None:
    import deep_gemm

    a = torch.zeros(4, 256, device="cuda", dtype=FP8)
    deep_gemm.fp8_gemm_nt((a, torch.ones(4, 2, device="cuda")),
                          (torch.zeros(256, 128, device="cuda", dtype=FP8),
                           torch.ones(2, 1, device="cuda")),
                          torch.empty(4, 256, device="cuda", dtype=torch.bfloat16))


CHECKS: dict[str, Check] = {
    "sgl_kernel.rmsnorm": rmsnorm, "sgl_kernel.fused_add_rmsnorm": fused_add_rmsnorm,
    "sgl_kernel.silu_and_mul": silu_and_mul,
    "sgl_kernel.sgl_per_token_group_quant_fp8": per_token_group_quant,
    "deep_gemm.fp8_gemm_nt": dg_gemm, "deep_gemm.fp8_m_grouped_gemm_nt_masked": dg_masked,
    "sgl_kernel bad shape raises": raises(_bad_rmsnorm, rmsnorm),
    "deep_gemm bad shape raises": raises(_bad_dg, dg_gemm),
}


def run_one(name: str) -> dict[str, object]:
    torch.manual_seed(0)
    try:
        err, bound = CHECKS[name]()
        return {"check": name, "rel_err": err, "bound": bound, "ok": err <= bound}
    except Exception as exc:  # noqa: BLE001 - reported, counted as a failure
        return {"check": name, "error": f"{type(exc).__name__}: {exc}"[:300], "ok": False}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run one check, print its row as JSON
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one)), flush=True)
        return 0
    import subprocess

    rows, ok = [], True
    procs = {name: subprocess.Popen([sys.executable, __file__, "--one", name],  # all at once
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in CHECKS}  # each in its own process: a check that crashes costs its row
    for name, p in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        last = (stdout.strip().splitlines() or [""])[-1]
        try:
            row = json.loads(last)
        except ValueError:
            row = {"check": name, "ok": False, "error": f"process exited {p.returncode}: "
                   + (stderr.strip().splitlines() or [""])[-1][:200]}
        rows.append(row)
        ok &= bool(row["ok"])
        print(f"[kernels] {'ok  ' if row['ok'] else 'FAIL'} {row}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
