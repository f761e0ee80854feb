"""The sections of `sglang-overlap check`'s report that describe this machine: python, torch
and its CUDA (read from files), SGLang and whether it discovers and loads the plugin, and the
installed kernels (deep_ep / deep_gemm versions, whether they import, the overlap forms they
declare, which SBO producer would serve). Each returns a JSON-ready dict; `check.gather` puts
them together.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from typing import Any

from sglang_overlap.kernels.capabilities import ProbeReport, combine_forms, nvidia_driver_present
from sglang_overlap.kernels.package_source import package_dir
from sglang_overlap.kernels.producers import sbo_producers

ENTRY_GROUP, ENTRY_NAME = "sglang.srt.plugins", "sglang_overlap"
IMPORT_SNIPPET = """
import json
out = {}
for name in ("deep_ep", "deep_gemm"):
    try:
        __import__(name)
        out[name] = None
    except BaseException as exc:
        out[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
print(json.dumps(out))
"""


def dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def start_import_check(skip: bool) -> subprocess.Popen[str] | None:
    """Try importing deep_ep / deep_gemm in a subprocess, running beside the rest of the
    report; not where no NVIDIA driver is loaded (they cannot load CUDA there)."""
    if skip or not nvidia_driver_present():
        return None
    return subprocess.Popen([sys.executable, "-c", IMPORT_SNIPPET], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def import_errors(proc: subprocess.Popen[str] | None) -> dict[str, str | None]:
    if proc is None:
        return {}
    try:
        stdout, _ = proc.communicate(timeout=180)
        result: dict[str, str | None] = json.loads(stdout.strip().splitlines()[-1])
        return result
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        proc.kill()
        return {"deep_ep": f"import check failed: {exc}", "deep_gemm": None}


def machine() -> dict[str, Any]:
    """python, torch and its CUDA version, read from files (torch is not imported)."""
    found: dict[str, str | None] = {"__version__": dist_version("torch"), "cuda": None}
    root = package_dir("torch")
    if root is not None and (root / "version.py").is_file():
        for line in (root / "version.py").read_text().splitlines():
            name, _, value = line.partition("=")
            name = name.split(":")[0].strip()
            if name in found:
                value = value.strip().strip("'\"")
                found[name] = None if value == "None" else value
    return {"python": sys.version.split()[0], "torch": found["__version__"],
            "cuda": found["cuda"]}


def sglang_section(load: bool, verdict: Any) -> dict[str, Any]:
    """sglang's version, the entry point, the version guard's `verdict`; with `load`, SGLang's
    own plugin loader run here (imports SGLang)."""
    eps = importlib.metadata.entry_points(group=ENTRY_GROUP)
    out: dict[str, Any] = {"version": dist_version("sglang"), "plugin": ENTRY_NAME,
                           "plugin_discovered": any(e.name == ENTRY_NAME for e in eps),
                           "plugin_loaded": None}
    if out["version"] is None:
        out["plugin_loaded"] = False
        return out
    from sglang_overlap.sglang import hooks

    if load:
        registered = hooks.load_through_sglang()
        out["plugin_loaded"] = registered > 0
        out["hooks_registered"] = registered
    problems = {**{f"{f} (on CPU servers)": p for f in verdict.off_on_cpu
                   if (p := verdict.message(f, cpu=True))},
                **{f: p for f in verdict.off if (p := verdict.message(f))}}
    out["guard"] = "ok" if not problems else "; ".join(
        f"{feature} off: {problem}" for feature, problem in problems.items())
    return out


def kernels_section(report: ProbeReport, errors: dict[str, str | None]) -> dict[str, Any]:
    forms = combine_forms(report.deep_ep.params)
    caps = report.capabilities
    out: dict[str, Any] = {}
    for probe_ in (report.deep_ep, report.deep_gemm):
        entry: dict[str, Any] = {"version": probe_.version, "function": probe_.function,
                                 "read": probe_.note}
        if probe_.module in errors and probe_.version is not None:
            entry["importable"] = errors[probe_.module] is None
            entry["import_error"] = errors[probe_.module]
        out[probe_.module] = entry
    out["deep_ep"]["low_latency_combine_overlap"] = (
        " + ".join(f.replace("_", "-") + " form" for f in forms) or "none")
    out["deep_gemm"]["masked_gemm_with_signals"] = caps.deep_gemm_signal
    out["triton"] = report.triton
    out["plugin_signal_gemm"] = caps.plugin_signal_gemm
    from sglang_overlap.kernels.signal_deepgemm import probe as probe_patched_deepgemm
    from sglang_overlap.kernels.signal_deepgemm import served_producer

    why_not = probe_patched_deepgemm()  # reads files only; no GPU needed to answer
    version, _, why = served_producer()
    if why_not is None and report.gpu.arch != "sm90":  # the headers would build, nothing runs it
        why_not = (f"an SM90 (Hopper) kernel; this machine: {report.gpu.arch} (the installed "
                   f"headers and nvcc would build it: {why})")
    out["plugin_patched_deepgemm"] = {"available": why_not is None, "deep_gemm": version,
                                      "reason": why_not or why}
    out["triton_version"] = report.triton_version
    out["sbo_producer"] = sbo_producers(why_not, triton_installed=report.triton,
                                        triton_version=report.triton_version).to_dict()
    return out
