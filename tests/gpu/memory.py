"""GPU memory per test: the `gpu_mem(GiB)` marker, its check on the GPU, and the pytest workers
each tests/gpu file can run on one card.

A test's `gpu_mem` is the most GPU memory its process holds while it runs: torch's reserved peak
plus what torch does not count (the CUDA context, DeepEP's buffer, kernel workspaces), set from
the measured peaks of benchmarks/gpu_test_memory.py with headroom; a test without one declares
`DEFAULT_GIB`. On a GPU (tests/gpu/conftest.py):

- before a test, less than its GiB available to this process (free on the card, plus what this
  process already holds) fails it at once, naming the workers that fit, instead of an
  out-of-memory error mid-test (other pytest workers hold the rest);
- after it, torch's reserved peak (plus `CONTEXT_GIB`) above its GiB fails it: raise the
  marker. With SGLANG_OVERLAP_GPU_MEM_LOG=FILE, every test's peak is appended to FILE (JSON).

    python -m tests.gpu.memory [--total-gib G] [FILE ...]

prints, per file, its largest `gpu_mem` and the pytest workers that fit a card of G GiB (default:
device 0's), and the command that runs the file with them.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

GIB = 2**30
DEFAULT_GIB = 4.0
"""A GPU test without a gpu_mem marker: small operands, one CUDA context."""
CONTEXT_GIB = 1.0
"""What a worker holds outside torch's allocator statistics: its CUDA context, the libraries'
workspaces (cuBLAS, triton, DeepGEMM)."""
CARD_RESERVE_GIB = 2.0
"""Of a card's total, what no worker can have (driver, other processes)."""
MAX_WORKERS = 8
"""Workers per file at most (each starts a CUDA context and compiles its own kernels); a file
may lower it with a module-level `MAX_WORKERS = N` and a comment saying why."""
LOG_ENV = "SGLANG_OVERLAP_GPU_MEM_LOG"
HERE = Path(__file__).resolve().parent


def workers(total_gib: float, need_gib: float, most: int = MAX_WORKERS) -> int:
    """pytest workers whose tests, each declaring at most `need_gib`, fit a card of
    `total_gib` at once (at least 1, at most `most`)."""
    return max(1, min(most, math.floor((total_gib - CARD_RESERVE_GIB) / need_gib)))


def declared(item: Any) -> float:
    """A collected test's gpu_mem (its own marker, else its module's, else DEFAULT_GIB)."""
    marker = item.get_closest_marker("gpu_mem")
    return float(marker.args[0]) if marker is not None else DEFAULT_GIB


def check_available(nodeid: str, need: float, free_gib: float, held_gib: float,
                    total_gib: float) -> str | None:
    """Why `need` GiB cannot be had (None: it can): free on the card plus what this process
    already holds, with its context."""
    have = free_gib + held_gib + CONTEXT_GIB
    if have >= need:
        return None
    return (f"{nodeid} declares gpu_mem({need:g}) GiB, and {have:.1f} of the card's "
            f"{total_gib:.1f} GiB are available to it (other pytest workers hold the rest): "
            f"run its file with at most {workers(total_gib, need)} workers "
            "(python -m tests.gpu.memory)")


def check_peak(nodeid: str, need: float, peak_gib: float) -> str | None:
    """Why the peak torch reserved breaks the declaration (None: it does not)."""
    if peak_gib + CONTEXT_GIB <= need:
        return None
    return (f"{nodeid} reserved {peak_gib:.1f} GiB of GPU memory (+{CONTEXT_GIB:g} context) "
            f"but declares gpu_mem({need:g}): raise its marker to at least "
            f"{math.ceil(peak_gib + CONTEXT_GIB)}")


def log_peak(nodeid: str, need: float, peak_gib: float) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": nodeid, "gpu_mem": need,
                                "reserved_peak_gib": round(peak_gib, 3)}) + "\n")


# ------------------------------------------------------------------ workers per file


def _marker_gib(node: ast.expr) -> float | None:
    """X of `pytest.mark.gpu_mem(X)` (a number), else None."""
    if (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("mark.gpu_mem")
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, int | float)):
        return float(node.args[0].value)
    return None


def is_gpu_file(path: Path) -> bool:
    """Whether `path`'s module-level pytestmark holds `pytest.mark.gpu`."""
    for node in ast.parse(path.read_text("utf-8")).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [
                node.value]
            return any(ast.unparse(v).endswith("mark.gpu") for v in values)
    return False


def file_max_workers(path: Path) -> int:
    """`path`'s module-level `MAX_WORKERS = N`, else MAX_WORKERS."""
    for node in ast.parse(path.read_text("utf-8")).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "MAX_WORKERS"
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int)):
            return node.value.value
    return MAX_WORKERS


def file_need(path: Path) -> float:
    """The largest gpu_mem a test of `path` declares (read from the source)."""
    tree = ast.parse(path.read_text("utf-8"))
    module = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [
                node.value]
            found = [g for v in values if (g := _marker_gib(v)) is not None]
            module = max(found) if found else module
    needs = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            own = [g for d in node.decorator_list if (g := _marker_gib(d)) is not None]
            needs.append(max(own) if own else module if module is not None else DEFAULT_GIB)
    return max(needs, default=DEFAULT_GIB)


def plan(total_gib: float, files: list[Path]) -> list[tuple[Path, float, int]]:
    """(file, its largest gpu_mem, workers) per file."""
    return [(f, need, workers(total_gib, need, file_max_workers(f)))
            for f in files for need in [file_need(f)]]


def groups(planned: list[tuple[Path, float, int]]) -> list[tuple[int, list[Path]]]:
    """The planned files gathered by worker count, most workers first: one pytest run each."""
    by: dict[int, list[Path]] = {}
    for path, _, n in planned:
        by.setdefault(n, []).append(path)
    return sorted(by.items(), key=lambda item: -item[0])


def _device_total_gib() -> float:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: pass --total-gib")
    return float(torch.cuda.mem_get_info()[1]) / GIB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--total-gib", type=float, default=None,
                    help="the card's memory (default: CUDA device 0's)")
    ap.add_argument("files", nargs="*", type=Path,
                    help="test files (default: every tests/gpu/test_*.py marked gpu)")
    ap.add_argument("--groups", action="store_true",
                    help="print one line per worker count: N FILE... (for run_gpu.sh gpusuite)")
    ap.add_argument("--exclude", action="append", default=[], metavar="NAME",
                    help="leave out the file of this name (repeatable)")
    args = ap.parse_args(argv)
    total = args.total_gib if args.total_gib is not None else _device_total_gib()
    files = args.files or [f for f in sorted(HERE.glob("test_*.py")) if is_gpu_file(f)]
    files = [f for f in files if f.name not in args.exclude]
    if args.groups:
        for n, paths in groups(plan(total, files)):
            print(n, *(os.path.relpath(f) for f in paths))
        return 0
    for path, need, n in plan(total, files):
        xdist = f"-n {n} " if n > 1 else ""
        print(f"{path.name}: gpu_mem {need:g} GiB, {n} worker{'s' * (n > 1)} on {total:.0f} "
              f"GiB: python -m pytest -q -p no:cacheprovider {xdist}{os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
