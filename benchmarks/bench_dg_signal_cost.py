"""H200: where the patched DeepGEMM kernel's signal cost goes (a diagnostic, not a served path).

bench_dg_signal.py measured the signalling kernel 2-4% slower than the same kernel with signals
off, in every signal form (per block, per expert, eager, deferred). This builds variants of the
patched header, each removing one piece of the signal path, and times them against signals-off
in interleaved rounds on a few shapes (per-block signals, the default tile):

    full        the patch as served
    relaxed     the signalling lane adds with red.relaxed instead of red.release
    read_wait   the store threads wait for the stores' shared-memory reads only (.read), as
                DeepGEMM does: signals may then precede the data (timing only)
    no_credit   no crediting of the blocks past masked_m at kernel start
    no_red      the signalling lane takes the hand-over but adds nothing
    no_lane     no signalling lane and no hand-over: the store threads only wait for the writes

Variants other than `full` break the signal contract; they exist to locate the cost.

    python benchmarks/bench_dg_signal_cost.py [--shapes ExCxROWS,...]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

N, K, SMS = 7168, 2048, 132
WAIT = 'asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");'
EDITS: dict[str, list[tuple[str, str]]] = {
    "full": [],
    "relaxed": [("ptx::red_add_rel(", "ptx::red_add(")],
    "read_wait": [(WAIT, 'asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");')],
    "no_credit": [("sbo_signal_credit_unvisited<kSignalMode, kSignalBlockM, BLOCK_M, BLOCK_N, "
                   "kNumGroups>(\n                    signal,",
                   "if (false) sbo_signal_credit_unvisited<kSignalMode, kSignalBlockM, BLOCK_M, "
                   "BLOCK_N, kNumGroups>(\n                    signal,")],
    "no_red": [("                        sbo_signal_tile<kSignalMode, kSignalBlockM, BLOCK_M>(\n",
                "                        if (false) sbo_signal_tile<kSignalMode, kSignalBlockM, "
                "BLOCK_M>(\n")],
    "no_lane": [("                if (cute::elect_one_sync()) {\n                    for (uint32_t "
                 "tile = 0;", "                if (false) {\n                    for (uint32_t "
                 "tile = 0;"),
                ("                signal_empty_barriers[num_signalled_tiles & 1]->wait(((num_"
                 "signalled_tiles >> 1) & 1) ^ 1);\n                signal_full_barriers[num_"
                 "signalled_tiles & 1]->arrive();\n", "")],
}
SHAPES = ((8, 64, 64), (32, 64, 16), (16, 128, 128))


def variant_include(name: str) -> Path:
    """A copy of the served (patched) include folder with `name`'s edits."""
    from sglang_overlap.kernels.signal_deepgemm import headers

    base = headers.prepared_include(headers.locate())
    if name == "full":
        return base
    target = base.parent.parent / f"{base.parent.name}-{name}" / "include"
    if not target.exists():
        shutil.copytree(base, target)
        header = target / headers.KERNEL_HEADER
        text = header.read_text()
        for old, new in EDITS[name]:
            if not text.count(old):
                raise SystemExit(f"variant {name}: edit target not found: {old!r}")
            text = text.replace(old, new)
        header.write_text(text)
    return target


def measure_shape(e: int, cap: int, rows: int, includes: dict[str, Path]) -> dict:
    """Each variant's kernel timed against signals-off in interleaved rounds."""
    import torch

    from benchmarks.bench_dg_signal import interleaved
    from benchmarks.gpu_suite import down_operands
    from sglang_overlap.kernels.signal_deepgemm import headers
    from sglang_overlap.kernels.signal_deepgemm import launch as ds
    from sglang_overlap.kernels.signal_deepgemm.configs import default_config
    from sglang_overlap.kernels.signals import new_signal
    from sglang_overlap.planning.sbo_layout import plan_sbo_layout

    a, a_s, b, b_s, masked = down_operands(e, cap, rows, seed=7)
    out = torch.empty((e, cap, N), dtype=torch.bfloat16, device="cuda")
    cfg = default_config(e, rows, cap, N, K, SMS)
    lay = plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=64, block_n=cfg.block_n,
                          hidden=N, num_sms=SMS, comm_num_sms=1, granularity="block")

    def launcher(sig, func):
        key = (a.device.index, cfg, e, N, K, SMS, "none" if sig is None else "block", 64)

        def run() -> None:
            ds._FUNCS.clear()  # noqa: SLF001 - this variant's kernel, not the served one
            ds._FUNCS[key] = func  # noqa: SLF001
            ds.masked_gemm_signal(a, a_s, b, b_s, out, masked, config=cfg, num_sms=SMS,
                                  signal=sig, layout=lay if sig is not None else None)

        return run

    fns = {}
    for name, inc in [("plain", includes["full"]), *includes.items()]:
        ds._SOURCE[:] = [(headers.locate(), inc)]  # noqa: SLF001 - swaps the header variant
        ds._FUNCS.clear()  # noqa: SLF001
        sig = new_signal(lay, "cuda") if name != "plain" else None
        ds.masked_gemm_signal(a, a_s, b, b_s, out, masked, config=cfg, num_sms=SMS,
                              signal=sig, layout=lay if sig is not None else None)
        fns[name] = launcher(sig, next(iter(ds._FUNCS.values())))  # noqa: SLF001
    torch.cuda.synchronize()
    times = interleaved(fns, rounds=11)
    row: dict = {"E": e, "C": cap, "rows": rows, "config": str(cfg)}
    for name, ts in times.items():
        row[name] = statistics.median(t / p for t, p in zip(ts, times["plain"], strict=True))
        row[f"{name}_us"] = statistics.median(ts)
    return row


def main(argv: list[str] | None = None) -> int:
    from sglang_overlap.kernels.signal_deepgemm import build, headers
    from sglang_overlap.kernels.signal_deepgemm.configs import default_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")] \
        if args.shapes else list(SHAPES)
    includes = {name: variant_include(name) for name in EDITS}
    jobs = []
    release = headers.locate().spec
    for e, cap, rows in shapes:
        cfg = default_config(e, rows, cap, N, K, SMS)
        for name, inc in includes.items():
            for mode in ("none", "block") if name == "full" else ("block",):
                jobs.append((build.kernel_source(cfg, release=release, num_groups=e, n=N, k=K,
                                                 num_sms=SMS, mode=mode, unit_m=64), inc))
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda j: build.compile_cubin(*j), jobs))
    results = []
    for e, cap, rows in shapes:
        row = measure_shape(e, cap, rows, includes)
        results.append(row)
        print(json.dumps(row), flush=True)
    names = ["plain", *EDITS]
    print("\n| E | C | rows | plain us | " + " | ".join(f"{n} / plain" for n in names[1:]) +
          " |\n|" + "---|" * (3 + len(names)))
    for r in results:
        print(f"| {r['E']} | {r['C']} | {r['rows']} | {r['plain_us']:.1f} | " +
              " | ".join(f"{r[n]:.3f}" for n in names[1:]) + " |")
    from benchmarks.bench_dg_signal import copy_tbps

    print(f"\ncopy (SM kernel, read + write): {copy_tbps():.2f} TB/s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
