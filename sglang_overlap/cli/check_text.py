"""`sglang-overlap check`'s report as text (`check.gather` builds it; `--json` prints it as is)."""

from __future__ import annotations

from typing import Any

from sglang_overlap.cli.check_model import POINT_AT_LOCAL
from sglang_overlap.kernels.capabilities import nvidia_driver_present
from sglang_overlap.modes import Mode


def render(out: dict[str, Any]) -> str:
    """The report `check.gather` returns, as the lines `sglang-overlap check` prints."""
    m, s, k = out["machine"], out["sglang"], out["kernels"]
    gpu = ("no CUDA GPU (CPU-only machine: kernels cannot run here)" if m["cpu_only"] else
           f"{m['gpu_name']} {m['gpu_arch']} capability {m['capability']}, {m['sm_count']} SMs")
    if m.get("gpu_problem"):
        gpu += f": {m['gpu_problem']}"
    if m.get("driver_cuda"):
        gpu += f"; NVIDIA driver for CUDA {m['driver_cuda']}, {m['gpu_count']} GPU(s) visible"
    loaded = {None: "SGLang loads it in every server process; --full runs its loader here",
              True: f"SGLang's loader registered {s.get('hooks_registered')} hooks",
              False: "NOT loaded"}[s["plugin_loaded"]]
    lines = [
        f"python {m['python']}, torch {m['torch']}, CUDA {m['cuda']}",
        f"GPU ({m['gpu_source']}): {gpu}",
        f"sglang {s['version']}: plugin {s['plugin']} "
        f"{'discovered' if s['plugin_discovered'] else 'NOT discovered'} ({loaded}); "
        f"version guard: {s.get('guard', 'not run')}",
    ]
    not_tried = ("import not tried" if nvidia_driver_present()
                 else "import not tried (no NVIDIA driver here)")
    for name in ("deep_ep", "deep_gemm"):
        e = k[name]
        imp = {True: "imports", False: f"does not import ({e.get('import_error')})",
               None: not_tried}[e.get("importable")]
        lines.append(f"{name} {e['version'] or 'not installed'}: {imp}; {e['read']}")
    lines += [
        f"  DeepEP low-latency combine overlap: {k['deep_ep']['low_latency_combine_overlap']}",
        f"  DeepGEMM masked GEMM with signals: {'yes' if k['deep_gemm']['masked_gemm_with_signals'] else 'no'}",  # noqa: E501
        f"  plugin signal GEMM (triton): {'yes' if k['plugin_signal_gemm'] else 'no'}",
        "  plugin signal GEMM (DeepGEMM's kernel, patched): "
        + ("yes" if k["plugin_patched_deepgemm"]["available"] else "no")
        + f" ({k['plugin_patched_deepgemm']['reason']})",
        f"  SBO down-GEMM producer (triton {k['triton_version']}): {k['sbo_producer']['serves']}",
    ]
    lines += [f"flags: warning: {w}" for w in out["flags"]["warnings"]]
    if out.get("model") is not None:
        lines.append(_model_line(out["model"]))
    sbo = out[Mode.SBO]
    lines.append(f"SBO: {sbo['path'] or 'REFUSED'}: {sbo['refusal'] or sbo['reason']}")
    lines.append(f"TBO: {out[Mode.TBO]['path']}")
    lines += _compat_lines(out["compat"])
    lines.append("ready" if out["ok"] else "NOT READY for these flags")
    return "\n".join(lines)


def _compat_lines(c: dict[str, Any]) -> list[str]:
    which = f" (--moe-a2a-backend {c['backend']})" if c.get("backend") else ""
    lines = [f"compatibility table rows matched{which}: " + (", ".join(c["matched"]) or "none")]
    if c["fast_path"] is not None:
        lines.append(f"fast path ({c['fast_path']}): "
                     + ("will serve" if c["fast_path_serves"] else "will NOT serve"))
    lines += [f"  missing {m['needs']}: {m['fix']}" for m in c["missing"]]
    return lines


def _model_line(model: dict[str, Any]) -> str:
    """One line: the architecture and where it was read, or why the model was not checked."""
    if model["problem"] is not None:
        return f"model {model['path']}: not checked: {model['problem']}; {POINT_AT_LOCAL}"
    return f"model {model['path']}: {model['architecture']} ({model['source']})"
