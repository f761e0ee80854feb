"""Fill DeepGEMM's JIT cache for the GEMMs a DeepSeek-V3 server runs, one process per GEMM shape
in parallel, through SGLang's own warm-up executors (`deep_gemm_wrapper.compile_utils`), so that
the servers of a run start without compiling (SGLang compiles lazily, one kernel at a time, when
SGLANG_JIT_DEEPGEMM_PRECOMPILE is off, and 10-20 minutes up front when it is on).

    python3 benchmarks/serve/warm_deepgemm.py MODEL_DIR [--max-prefill 4096] [--max-rows 128]
        [--low-latency-only] [--workers 12] [--json OUT]

Shapes from MODEL_DIR/config.json (DeepSeek-V3 layout, fp8 128x128 blocks, one rank): the dense
fp8 linears (q_a + kv_a fused, q_b, kv_b, o_proj, the dense MLP, the shared expert) for M in
[1, --max-prefill], the masked grouped GEMMs of DeepEP's low-latency decode (256 groups) for
expected M in [1, --max-rows], the contiguous grouped GEMMs of its normal-mode prefill for M up
to --max-prefill x top-k rows plus one alignment block per expert (none with
--low-latency-only: prefill through the low-latency kernels too, as on one rank). Prints one
JSON line per shape (seconds, kernels compiled = files new in the cache) and exits 1 if any
shape failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def shapes(cfg: dict, max_prefill: int, max_rows: int, contiguous: bool = True) -> list[dict]:
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    q_lora, kv_lora = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    dense, moe, e = cfg["intermediate_size"], cfg["moe_intermediate_size"], cfg["n_routed_experts"]
    shared = moe * cfg.get("n_shared_experts", 1)
    gemm = "GEMM_NT_F8F8BF16"
    out = [{"type": gemm, "n": n, "k": k, "groups": 1, "max_m": max_prefill} for n, k in (
        (q_lora + kv_lora + rope, h), (heads * (nope + rope), q_lora),
        (heads * (nope + v), kv_lora), (h, heads * v), (2 * dense, h), (h, dense),
        (2 * shared, h), (h, shared))]
    for n, k in ((2 * moe, h), (h, moe)):
        out.append({"type": "GROUPED_GEMM_NT_F8F8BF16_MASKED", "n": n, "k": k, "groups": e,
                    "max_m": max_rows})
        if contiguous:
            out.append({"type": "GROUPED_GEMM_NT_F8F8BF16_CONTIG", "n": n, "k": k, "groups": e,
                        "max_m": max_prefill * cfg["num_experts_per_tok"] + e * 128})
    return out


def warm_one(job: dict) -> None:
    import torch
    from sglang.srt.layers.deep_gemm_wrapper import compile_utils as cu

    kind = cu.DeepGemmKernelType[job["type"]]
    ms = list(range(1, job["max_m"] + 1))
    if kind == cu.DeepGemmKernelType.GROUPED_GEMM_NT_F8F8BF16_CONTIG:
        import deep_gemm

        align = deep_gemm.get_mk_alignment_for_contiguous_layout()
        ms = list(range(align, job["max_m"] + 1, align))
    ex = cu._BaseWarmupExecutor.create(kind, max_m=job["max_m"], n=job["n"], k=job["k"],
                                       num_groups=job["groups"])
    for m in ms:
        ex.execute(m=m)
    torch.cuda.synchronize()


def cache_files() -> int:
    root = Path(os.environ.get("SGLANG_DG_CACHE_DIR") or os.environ.get("DG_JIT_CACHE_DIR", "."))
    return sum(1 for p in root.rglob("*.cubin")) if root.is_dir() else 0


def run_job(job: dict) -> dict:
    t0 = time.time()
    p = subprocess.run([sys.executable, __file__, "--one", json.dumps(job)],
                       capture_output=True, text=True, timeout=900)
    rec = {**job, "s": round(time.time() - t0, 1), "ok": p.returncode == 0}
    if p.returncode:
        rec["error"] = (p.stderr.strip().splitlines() or ["?"])[-1][:300]
    print(json.dumps(rec), flush=True)
    return rec


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--max-prefill", type=int, default=4096)
    ap.add_argument("--max-rows", type=int, default=128)
    ap.add_argument("--low-latency-only", action="store_true")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--json")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        warm_one(json.loads(args.one))
        return 0
    cfg = json.loads((Path(args.model) / "config.json").read_text())
    jobs = shapes(cfg, args.max_prefill, args.max_rows, not args.low_latency_only)
    before, t0 = cache_files(), time.time()
    with ThreadPoolExecutor(args.workers) as pool:  # longest first: the contiguous GEMMs
        recs = list(pool.map(run_job, sorted(jobs, key=lambda j: -j["max_m"] * j["groups"])))
    summary = {"shapes": len(recs), "failed": sum(not r["ok"] for r in recs),
               "cubins_new": cache_files() - before, "wall_s": round(time.time() - t0, 1)}
    print(json.dumps(summary), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "shapes": recs}, indent=1))
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
