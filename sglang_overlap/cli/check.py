"""`sglang-overlap check`: is this machine ready for these server flags?

Takes the same flags as `sglang serve` and runs the server's own validation on them
(`sglang.server_args.check_settings`); flags made only of the overlap, MoE and layout ones are
read without importing SGLang (`check_flags.parse_fast`: an answer in about a second), any other
flag, or `--full`, goes through SGLang's own parser with the plugin loaded. A flag SGLang or the
plugin would refuse, or a served model a mode asked for is not proven on (`check_model`), is one
`error:` line, exit status 2 (with `--json`, the report says so). It reports: the SGLang version
and whether the plugin is discovered and loaded; torch and its CUDA (read from files), the GPUs
as the CUDA driver reports them (`kernels.cuda_device`, ctypes: torch is not imported);
deep_ep / deep_gemm versions, whether they import, and which overlap forms they declare (read
from their Python files; the import is tried in a subprocess where an NVIDIA driver is present);
the served model's architecture; and the SBO and TBO paths these flags would use. Exit status 1
when the flags cannot work here, or when the model could not be checked (one line says why).
`--assume-arch sm90` answers for a Hopper box from any machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sglang_overlap.cli import check_flags, check_model, check_sections
from sglang_overlap.cli.check_text import render
from sglang_overlap.kernels.capabilities import (
    ARCH_CHOICES,
    ProbeReport,
    probe,
)
from sglang_overlap.modes import Mode
from sglang_overlap.settings import OverlapSettings, SettingsError, validate_settings

NO_A2A = "none"  # --moe-a2a-backend's value for no all-to-all backend

def add_parser(subparsers: argparse._SubParsersAction, name: str, help: str) -> None:
    p = subparsers.add_parser(
        name, help=help, description=__doc__.splitlines()[0],
        epilog="Any other flag is a server flag, e.g. `sglang-overlap check "
        "--enable-single-batch-overlap --moe-a2a-backend deepep --tp 2 --model-path M`.")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--assume-arch", choices=ARCH_CHOICES, default=None,
                   help="answer as if device 0 were this GPU architecture (or no GPU)")
    p.add_argument("--no-import-check", action="store_true",
                   help="skip trying to import deep_ep / deep_gemm (done in a subprocess, only "
                   "where an NVIDIA driver is present)")
    p.add_argument("--full", action="store_true",
                   help="read every flag with SGLang's own parser and run SGLang's plugin loader "
                   "here, even when the fast reader knows every flag given (slower: imports "
                   "SGLang)")
    p.set_defaults(func=run, server_argv=[])
    inner = p.parse_known_args

    def parse_known_args(args: Any = None, namespace: Any = None) -> Any:
        ns, rest = inner(args, namespace)  # server flags pass through to SGLang's parser
        ns.server_argv = list(getattr(ns, "server_argv", [])) + list(rest)
        return ns, []

    p.parse_known_args = parse_known_args


def _tbo(settings: OverlapSettings, values: Any) -> str:
    if not settings.enable_two_batch_overlap:
        return "off"
    a2a = settings.requested_a2a_backend
    mode = str(getattr(values, "deepep_mode", "auto"))
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
           import_check: bool = True, full: bool = False) -> tuple[dict[str, Any], int]:
    """The readiness report and the exit status it implies: 2 when the flags would be refused
    at start (then nothing is evaluated for them), 1 when they cannot work on this machine."""
    from sglang_overlap.plugin import guard_verdict

    imports = check_sections.start_import_check(not import_check)
    verdict, _ = guard_verdict()  # files read; what it turns off is refused, as at start-up
    flags: dict[str, Any] = {"server_argv": server_argv, "errors": [], "warnings": []}
    settings, values = _parse(server_argv, flags, full)
    if settings is not None and values is not None:  # the expert layout `plan` would refuse
        from sglang_overlap.cli.plan import expert_layout_error

        if (why := expert_layout_error(values)) is not None:
            flags["errors"].append(why)
            settings = None
    settings, model = _model(settings, values, flags)
    report = probe(assume_arch=assume_arch)
    gpu = report.gpu
    out: dict[str, Any] = {
        "machine": {**check_sections.machine(), "gpu_arch": gpu.arch, "gpu_source": gpu.source,
                    "gpu_name": gpu.name, "capability": gpu.capability, "sm_count": gpu.sm_count,
                    "gpu_count": gpu.device_count, "driver_cuda": gpu.driver_cuda,
                    "gpu_problem": gpu.problem, "cpu_only": gpu.arch == "cpu"},
        "sglang": check_sections.sglang_section(
            full or "sglang.srt.server_args" in sys.modules, verdict),
        "kernels": check_sections.kernels_section(report, check_sections.import_errors(imports)),
        "flags": flags,
    }
    out["flags"]["settings"] = settings.to_dict() if settings else None
    out["model"] = model.to_dict() if model is not None else None
    status = 0
    if settings is None:
        status = 2
        out[Mode.SBO] = {"path": None, "reason": "not evaluated: the flags would be refused",
                      "refusal": None}
        out[Mode.TBO] = {"path": None}
    else:
        out[Mode.SBO], status = _sbo(settings, values, report)
        out[Mode.TBO] = {"path": _tbo(settings, values)}
    out["compat"] = _compat(report, out, settings)
    if out["sglang"].get("guard", "ok") != "ok" or (model is not None and not model.checked):
        status = status or 1
    out["ok"] = status == 0
    return out, status


def _sbo(settings: OverlapSettings, values: Any, report: ProbeReport) -> tuple[dict[str, Any], int]:
    from sglang_overlap.sglang.sbo_decision import decide_sbo

    a2a = settings.requested_a2a_backend
    runner = str(getattr(values, "moe_runner_backend", "auto"))
    try:
        decision, _ = decide_sbo(settings, a2a_backend=a2a, runner_backend=runner, report=report)
    except ValueError as exc:  # the declared combine signature rejects the chosen form
        return {"path": None, "reason": "refused", "refusal": str(exc)}, 1
    return ({"path": decision.path.value if decision.path else None, "reason": decision.reason,
             "refusal": decision.refusal}, 1 if decision.refusal else 0)


def _parse(argv: list[str], flags: dict[str, Any],
           full: bool) -> tuple[OverlapSettings | None, Any]:
    """(settings, the parsed namespace or ServerArgs); (None, None) with the error in
    flags["errors"] when the server would refuse `argv`."""
    from sglang_overlap.sglang.upstream.server_args import check_settings, server_facts

    if not argv:
        return OverlapSettings(), None  # no flags: the machine alone
    try:
        check_model.check_readable(argv)  # a broken config.json: one line, not a traceback
        ns = None if full else check_flags.parse_fast(argv)
        if ns is not None:
            flags["read_by"] = "the plugin's reader of the overlap, MoE and layout flags"
            settings = check_flags.settings_of(ns)
            flags["warnings"] = check_settings(settings, ns)
            return settings, ns
        flags["read_by"] = "SGLang's parser, with the plugin loaded"
        server_args = check_flags.parse_with_sglang(argv)  # runs check_settings
    except (check_flags.FlagError, SettingsError) as exc:
        flags["errors"].append(check_flags.one_line(exc))
        return None, None
    settings = check_flags.settings_of(server_args)
    flags["warnings"] = validate_settings(settings, server_facts(server_args))
    return settings, server_args


def _model(settings: OverlapSettings | None, values: Any,
           flags: dict[str, Any]) -> tuple[OverlapSettings | None, check_model.ModelCheck | None]:
    """The served model checked against the modes asked for; a refusal is a flag error, as at
    start-up (settings None)."""
    if settings is None:
        return None, None
    try:
        return settings, check_model.examine(settings, values)
    except (check_flags.FlagError, SettingsError) as exc:
        flags["errors"].append(check_flags.one_line(exc))
        return None, None


def _compat(report: ProbeReport, out: dict[str, Any],
            settings: OverlapSettings | None) -> dict[str, Any]:
    """The compatibility table's answer for the installed versions (`sglang_overlap.compat`);
    with an EP backend asked for, only the rows of that backend are listed as matched."""
    from sglang_overlap.compat import Stack, evaluate, rows
    from sglang_overlap.kernels.signal_deepgemm.build import nvcc_path
    from sglang_overlap.kernels.signal_deepgemm.versions import DgSignalError

    try:
        nvcc = nvcc_path() is not None
    except DgSignalError:
        nvcc = False
    caps = report.capabilities
    stack = Stack(arch=caps.arch, sglang=out["sglang"]["version"], deep_ep=caps.deep_ep_version,
                  deep_ep_forms=caps.deep_ep_combine_forms, deep_gemm=caps.deep_gemm_version,
                  nvcc=nvcc, triton=report.triton and report.triton_problem is None)
    verdict: dict[str, Any] = evaluate(stack).to_dict()
    patched = out["kernels"]["plugin_patched_deepgemm"]
    if verdict["fast_path"] == "sm90-patched-deepgemm" and verdict["fast_path_serves"] \
            and not patched["available"]:  # e.g. the installed header is not the patched one
        verdict["fast_path_serves"] = False
        verdict["missing"] = [{"needs": "the patched DeepGEMM producer", "fix": patched["reason"]}]
    asked = settings.requested_a2a_backend if settings is not None else NO_A2A
    if asked != NO_A2A:
        backend = {r.name: r.tbo.split()[0] for r in rows()}
        verdict["matched"] = [m for m in verdict["matched"] if backend[m] == asked]
        verdict["backend"] = asked
    return {"stack": {k: getattr(stack, k) for k in Stack.__dataclass_fields__}, **verdict}


def run(args: argparse.Namespace) -> int:
    out, status = gather(list(args.server_argv), assume_arch=args.assume_arch,
                         import_check=not args.no_import_check, full=args.full)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    elif out["flags"]["errors"]:  # as argparse ends a bad command line: one line, exit 2
        print(f"sglang-overlap check: error: {out['flags']['errors'][0]}", file=sys.stderr)
    else:
        print(render(out))
    return status
