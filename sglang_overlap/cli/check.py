"""`sglang-overlap check`: is this machine ready for these server flags?

Takes the same flags as `sglang serve` (passed through to SGLang's own parser with the plugin
loaded) and reports: the SGLang version and whether the plugin is discovered and loaded; torch,
CUDA, the GPU architecture and SM count; deep_ep / deep_gemm versions, whether they import, and
which overlap forms they declare (read from their Python files: nothing CUDA is loaded in this
process); and the SBO and TBO paths these flags would use. Exit status 1 when the flags cannot
work here (2 when SGLang's parser rejects them). `--assume-arch sm90` answers for a Hopper box
from any machine.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
from typing import Any

from sglang_overlap.kernels.capabilities import ARCH_CHOICES, ProbeReport, combine_forms, probe
from sglang_overlap.settings import OverlapSettings, SettingsError

ENTRY_GROUP, ENTRY_NAME = "sglang.srt.plugins", "sglang_overlap"
_IMPORT_SNIPPET = """
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


def add_parser(subparsers: argparse._SubParsersAction, name: str, help: str) -> None:
    p = subparsers.add_parser(
        name, help=help, description=__doc__.splitlines()[0],
        epilog="Any other flag is a server flag, e.g. `sglang-overlap check "
        "--enable-single-batch-overlap --moe-a2a-backend deepep --tp 2 --model-path M`.")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--assume-arch", choices=ARCH_CHOICES, default=None,
                   help="answer as if device 0 were this GPU architecture (or no GPU)")
    p.add_argument("--no-import-check", action="store_true",
                   help="skip trying to import deep_ep / deep_gemm (done in a subprocess)")
    p.set_defaults(func=run, server_argv=[])
    inner = p.parse_known_args

    def parse_known_args(args: Any = None, namespace: Any = None) -> Any:
        ns, rest = inner(args, namespace)  # server flags pass through to SGLang's parser
        ns.server_argv = list(getattr(ns, "server_argv", [])) + list(rest)
        return ns, []

    p.parse_known_args = parse_known_args


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _import_errors(skip: bool) -> dict[str, str | None]:
    if skip:
        return {}
    try:
        done = subprocess.run([sys.executable, "-c", _IMPORT_SNIPPET], capture_output=True,
                              text=True, timeout=180)
        result: dict[str, str | None] = json.loads(done.stdout.strip().splitlines()[-1])
        return result
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return {"deep_ep": f"import check failed: {exc}", "deep_gemm": None}


def _sglang_section() -> dict[str, Any]:
    eps = importlib.metadata.entry_points(group=ENTRY_GROUP)
    out: dict[str, Any] = {"version": _version("sglang"),
                           "plugin_discovered": any(e.name == ENTRY_NAME for e in eps),
                           "plugin_loaded": False}
    if out["version"] is None:
        return out
    from sglang_overlap.sglang import guard, hooks

    registered = hooks.load_through_sglang()
    out["plugin_loaded"] = registered > 0
    out["hooks_registered"] = registered
    result = guard.check(hooks.all_pins())
    out["guard"] = "ok" if result.ok else result.message()
    return out


def _kernels_section(report: ProbeReport, errors: dict[str, str | None]) -> dict[str, Any]:
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
    out["plugin_patched_deepgemm"] = {"available": why_not is None, "deep_gemm": version,
                                      "reason": why_not or why}
    return out


def _tbo(settings: OverlapSettings, server_args: Any) -> str:
    if not settings.enable_two_batch_overlap:
        return "off"
    a2a = str(getattr(server_args, "moe_a2a_backend", "none"))
    mode = str(getattr(server_args, "deepep_mode", "auto"))
    t = settings.tbo_token_distribution_threshold
    chunk = f"two-chunk at t={t}" if t > 0 else "two-chunk off"
    parts = ["decode/verify: 5-stage schedule, micro-batch B two stages behind"]
    if a2a == "deepep" and mode == "low_latency":
        parts.append("prefill: no TBO (DeepEP low-latency prefill, as upstream)")
    else:
        parts.append(f"prefill: 3-stage schedule, {chunk}")
    gating = ("gated per step by measured step times" if settings.overlap_gating == "auto"
              else "always")
    return f"on ({a2a}; {gating}): " + "; ".join(parts)


def gather(server_argv: list[str], *, assume_arch: str | None = None,
           import_check: bool = True) -> tuple[dict[str, Any], int]:
    """The readiness report and the exit status it implies."""
    import torch

    report = probe(assume_arch=assume_arch)
    gpu = report.gpu
    out: dict[str, Any] = {
        "machine": {"python": sys.version.split()[0], "torch": torch.__version__,
                    "cuda": torch.version.cuda, "gpu_arch": gpu.arch, "gpu_source": gpu.source,
                    "gpu_name": gpu.name, "capability": gpu.capability, "sm_count": gpu.sm_count,
                    "cpu_only": gpu.arch == "cpu"},
        "sglang": _sglang_section(),
        "kernels": _kernels_section(report, _import_errors(not import_check)),
        "flags": {"server_argv": server_argv, "errors": [], "warnings": []},
    }
    status = 0
    settings, server_args = OverlapSettings(), None
    if server_argv:
        settings, server_args, status = _parse(server_argv, out["flags"])
    out["flags"]["settings"] = settings.to_dict()
    a2a = str(getattr(server_args, "moe_a2a_backend", "none"))
    runner = str(getattr(server_args, "moe_runner_backend", "auto"))
    from sglang_overlap.sglang.sbo_decision import decide_sbo

    try:
        decision, _ = decide_sbo(settings, a2a_backend=a2a, runner_backend=runner, report=report)
        out["sbo"] = {"path": decision.path.value if decision.path else None,
                      "reason": decision.reason, "refusal": decision.refusal}
        status = status or (1 if decision.refusal else 0)
    except ValueError as exc:  # the declared combine signature rejects the chosen form
        out["sbo"] = {"path": None, "reason": "refused", "refusal": str(exc)}
        status = status or 1
    out["tbo"] = {"path": _tbo(settings, server_args)}
    out["compat"] = _compat(report, out)
    if out["sglang"].get("guard", "ok") != "ok":
        status = status or 1
    out["ok"] = status == 0
    return out, status


def _compat(report: ProbeReport, out: dict[str, Any]) -> dict[str, Any]:
    """The compatibility table's answer for the installed versions (`sglang_overlap.compat`)."""
    from sglang_overlap.compat import Stack, evaluate
    from sglang_overlap.kernels.signal_deepgemm.build import nvcc_path
    from sglang_overlap.kernels.signal_deepgemm.versions import DgSignalError

    try:
        nvcc = nvcc_path() is not None
    except DgSignalError:
        nvcc = False
    caps = report.capabilities
    stack = Stack(arch=caps.arch, sglang=out["sglang"]["version"], deep_ep=caps.deep_ep_version,
                  deep_ep_forms=caps.deep_ep_combine_forms, deep_gemm=caps.deep_gemm_version,
                  nvcc=nvcc, triton=report.triton)
    verdict = evaluate(stack).to_dict()
    patched = out["kernels"]["plugin_patched_deepgemm"]
    if verdict["fast_path"] == "sm90-patched-deepgemm" and verdict["fast_path_serves"] \
            and not patched["available"]:  # e.g. the installed header is not the patched one
        verdict["fast_path_serves"] = False
        verdict["missing"] = [{"needs": "the patched DeepGEMM producer", "fix": patched["reason"]}]
    return {"stack": {k: getattr(stack, k) for k in Stack.__dataclass_fields__}, **verdict}


def _parse(argv: list[str], flags: dict[str, Any]) -> tuple[OverlapSettings, Any, int]:
    from sglang_overlap.sglang.server_args import parse_server_args

    try:
        server_args, settings = parse_server_args(argv)
    except SettingsError as exc:
        flags["errors"].append(str(exc))
        return OverlapSettings(), None, 1
    except SystemExit as exc:
        flags["errors"].append(f"SGLang's parser rejected the server flags (exit {exc.code}; "
                               "its message is above); the paths below read only the "
                               "overlap and MoE flags")
        settings, ns = _overlap_flags_only(argv)
        return settings, ns, 2
    from sglang_overlap.settings import validate_settings
    from sglang_overlap.sglang.server_args import server_facts

    flags["warnings"] = validate_settings(settings, server_facts(server_args))
    return settings, server_args, 0


def _overlap_flags_only(argv: list[str]) -> tuple[OverlapSettings, argparse.Namespace]:
    """The overlap and MoE flags alone, for a report when SGLang's parser rejects the rest."""
    from sglang_overlap.settings import add_arguments

    p = argparse.ArgumentParser(add_help=False)
    add_arguments(p, include_upstream=True)
    for flag, default in (("--moe-a2a-backend", "none"), ("--moe-runner-backend", "auto"),
                          ("--deepep-mode", "auto")):
        if flag not in p._option_string_actions:  # noqa: SLF001 - argparse has no public view
            p.add_argument(flag, default=default)
    ns, _ = p.parse_known_args(argv)
    return OverlapSettings.from_mapping(vars(ns)), ns


def _print(out: dict[str, Any]) -> None:
    m, s, k = out["machine"], out["sglang"], out["kernels"]
    gpu = ("no CUDA GPU (CPU-only machine: kernels cannot run here)" if m["cpu_only"] else
           f"{m['gpu_name']} {m['gpu_arch']} capability {m['capability']}, {m['sm_count']} SMs")
    lines = [
        f"python {m['python']}, torch {m['torch']}, CUDA {m['cuda']}",
        f"GPU ({m['gpu_source']}): {gpu}",
        f"sglang {s['version']}: plugin {ENTRY_NAME} discovered={s['plugin_discovered']}, "
        f"loaded={s['plugin_loaded']}; version guard: {s.get('guard', 'not run')}",
    ]
    for name in ("deep_ep", "deep_gemm"):
        e = k[name]
        imp = {True: "imports", False: f"does not import ({e.get('import_error')})",
               None: "import not tried"}[e.get("importable")]
        lines.append(f"{name} {e['version'] or 'not installed'}: {imp}; {e['read']}")
    lines += [
        f"  DeepEP low-latency combine overlap: {k['deep_ep']['low_latency_combine_overlap']}",
        f"  DeepGEMM masked GEMM with signals: {'yes' if k['deep_gemm']['masked_gemm_with_signals'] else 'no'}",  # noqa: E501
        f"  plugin signal GEMM (triton): {'yes' if k['plugin_signal_gemm'] else 'no'}",
        "  plugin signal GEMM (DeepGEMM's kernel, patched): "
        + ("yes" if k["plugin_patched_deepgemm"]["available"] else "no")
        + f" ({k['plugin_patched_deepgemm']['reason']})",
    ]
    lines += [f"flags: ERROR {err}" for err in out["flags"]["errors"]]
    lines += [f"flags: warning: {w}" for w in out["flags"]["warnings"]]
    sbo = out["sbo"]
    lines.append(f"SBO: {sbo['path'] or 'REFUSED'}: {sbo['refusal'] or sbo['reason']}")
    lines.append(f"TBO: {out['tbo']['path']}")
    lines += _compat_lines(out["compat"])
    lines.append("ready" if out["ok"] else "NOT READY for these flags")
    print("\n".join(lines))


def _compat_lines(c: dict[str, Any]) -> list[str]:
    lines = ["compatibility table rows matched: " + (", ".join(c["matched"]) or "none")]
    if c["fast_path"] is not None:
        lines.append(f"fast path ({c['fast_path']}): "
                     + ("will serve" if c["fast_path_serves"] else "will NOT serve"))
    lines += [f"  missing {m['needs']}: {m['fix']}" for m in c["missing"]]
    return lines


def run(args: argparse.Namespace) -> int:
    out, status = gather(list(args.server_argv), assume_arch=args.assume_arch,
                         import_check=not args.no_import_check)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        _print(out)
    return status
