"""One rank of the staged DeepEP (the `deep_ep` first on sys.path): a low-latency buffer,
dispatch and combine of random tokens against `x * sum(topk_weights)` (what a one-rank
dispatch + combine returns), and the combine's overlap form with its signals preset to their
final value (the send must not wait), through the plugin's `combine_overlap_kwargs`.

    python3 benchmarks/serve/deepep_check.py [--json OUT]

Prints one line (JSON) and exits 1 if anything fails. Needs torch with NCCL (one process, world
size 1) and a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

T, H, E, K = 128, 7168, 16, 8


def run() -> dict[str, object]:
    import torch
    import torch.distributed as dist

    from sglang_overlap.kernels.capabilities import combine_forms
    from sglang_overlap.kernels.combine_overlap import combine_overlap_kwargs
    from sglang_overlap.kernels.package_source import probe_package

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    import deep_ep

    probe = probe_package("deep_ep", ("Buffer.low_latency_combine",))
    forms = combine_forms(probe.params)
    rec: dict[str, object] = {"deep_ep": probe.version, "location": probe.location,
                              "forms": sorted(forms), "nccl": list(torch.cuda.nccl.version())}
    t0 = time.time()
    buf = deep_ep.Buffer(dist.new_group([0]), low_latency_mode=True, num_qps_per_rank=E,
                         num_rdma_bytes=deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, 1, E))
    rec["buffer_s"] = round(time.time() - t0, 2)
    torch.manual_seed(1)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    idx = torch.topk(torch.rand(T, E, device="cuda"), K, dim=-1)[1]
    idx = idx.to(getattr(deep_ep, "topk_idx_t", torch.int64))
    w = torch.rand(T, K, device="cuda")
    ref = x.double() * w.double().sum(-1, keepdim=True)
    recv_x, count, handle, _, hook = buf.low_latency_dispatch(x, idx, T, E, use_fp8=False,
                                                              return_recv_hook=True)
    hook()
    torch.cuda.synchronize()
    rec["dispatched_rows"] = int(count.sum())
    out, _, hook = buf.low_latency_combine(recv_x, idx, w, handle, return_recv_hook=True)
    hook()
    torch.cuda.synchronize()
    rel = float((out.double() - ref).norm() / ref.norm())
    rec["combine_rel_err"] = rel
    ok = rec["dispatched_rows"] == T * K and rel < 1e-2
    for form in sorted(forms):
        if form == "per_expert":
            sig = torch.full((E,), 5, dtype=torch.uint32, device="cuda")
            kw = combine_overlap_kwargs(form, signal=sig, expect_value=5)
        else:  # per_block: 64-row blocks of the C = T receive rows, final at 1
            blocks = E * -(-T // 64)
            sig = torch.ones(blocks, dtype=torch.int32, device="cuda")
            kw = combine_overlap_kwargs(form, signal=sig, packed_recv_count=count, block_m=64,
                                        threshold=1, num_sms=3)
        out2, _, hook = buf.low_latency_combine(recv_x, idx, w, handle, return_recv_hook=True,
                                                **kw)
        hook()
        torch.cuda.synchronize()
        err = float((out2.double() - ref).norm() / ref.norm())
        rec[f"overlap_{form}_rel_err"] = err
        ok = ok and err < 1e-2
    rec["ok"] = ok
    dist.destroy_process_group()
    return rec


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    try:
        rec = run()
    except Exception as exc:  # noqa: BLE001 - reported as the row
        rec = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    print(json.dumps(rec), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rec, f, indent=1)
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
