"""`sglang-overlap plan`: predict each overlap mode's time for a deployment, and recommend one.

With no arguments it plans the embedded default deployment: DeepSeek-V3 decode on 2 x 8 H20,
DP16 + EP16, 32 sequences per GPU, 4096-token context (the setup of SGLang's published SBO
result).
Imports only the pure-Python planning layer (no torch, no sglang): it answers in well under a
second; `--plot` imports matplotlib, and only then.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from sglang_overlap.modes import PHASES, PLAN_MODES, Mode, Phase
from sglang_overlap.planning.cost.cost_model import Prediction, predict
from sglang_overlap.planning.cost.experts import (
    DISPATCH_CHOICES,
    TRIVIAL,
    ExpertLayout,
    check_eplb,
    check_expert_layout,
    idle_replicas_note,
    layout_of,
    replicas_dispatched,
    server_ep_size,
)
from sglang_overlap.planning.cost.model_config import model_from_hf_config
from sglang_overlap.planning.cost.profiles import (
    GPU_NAMES,
    MODEL_ALIASES,
    MODEL_NAMES,
    Deployment,
    ModelProfile,
    ProfileError,
    load_hardware,
    load_model,
)
from sglang_overlap.planning.two_chunk import check_threshold

DEFAULTS = Deployment()


def _model_help() -> str:
    names = [name + "".join(f", {a}" for a, n in MODEL_ALIASES.items() if n == name)
             for name in MODEL_NAMES]
    return (f"a shipped profile ({'; '.join(names)}), a Hugging Face id of one "
            "(deepseek-ai/DeepSeek-V3), a model directory with config.json, or a model JSON")


def add_parser(subparsers: Any, name: str, help: str) -> None:  # noqa: A002 - dispatcher's API
    p = subparsers.add_parser(
        name, help=help, description=__doc__.split("\n\n")[0] + " Defaults: DeepSeek-V3 decode "
        "on 2x8 H20, EP16 with DP attention, 32 tokens per GPU, 4096-token context. The layout "
        "flags are SGLang's (`--model-path`, `--tp-size`/`--tp`, `--ep-size`/`--ep`, `--nnodes`, "
        "`--dp-size`, `--enable-dp-attention`, `--attn-dp-size`, `--ep-num-redundant-experts`, "
        "`--init-expert-location`, `--enable-eplb`, `--ep-dispatch-algorithm`), so a serve "
        "command's layout can be pasted; `--tp-size` without `--ep-size` means EP = TP, as with "
        "`--moe-a2a-backend deepep`.")
    p.add_argument("--gpu", default="H20", metavar="GPU",
                   help=f"{', '.join(GPU_NAMES)}, or a profile JSON (e.g. one written by the "
                        "source repository's calibrate.py, or {\"base\": \"H20\", ...} "
                        "overrides)")
    p.add_argument("--model-path", "--model", dest="model", default="deepseek-v3",
                   metavar="MODEL", help=_model_help())
    p.add_argument("--phase", choices=PHASES, default=DEFAULTS.phase)
    p.add_argument("--ep-size", "--expert-parallel-size", "--ep", dest="ep", type=int,
                   default=None, help=f"expert-parallel size (default: --tp-size if given, else "
                   f"{DEFAULTS.ep_size}); must divide the model's routed + redundant experts")
    p.add_argument("--ep-num-redundant-experts", dest="redundant", type=int, default=0,
                   metavar="N", help="SGLang's redundant expert slots per MoE layer (default 0; "
                   "DeepSeek-V3 on EP 72: 32, making 288 = 72 x 4)")
    p.add_argument("--init-expert-location", type=str, default=TRIVIAL, metavar="LOCATION",
                   help="SGLang's initial expert placement (default trivial); any other value "
                   "turns on the dispatch that sends tokens to the redundant copies")
    p.add_argument("--enable-eplb", action="store_true",
                   help="SGLang's EPLB: tokens reach the redundant copies; needs --ep-size > 1")
    p.add_argument("--ep-dispatch-algorithm", type=str, choices=DISPATCH_CHOICES, default=None,
                   help="SGLang's replica dispatch (default: static with --enable-eplb or a "
                   "non-trivial --init-expert-location, else none: redundant copies stay idle)")
    p.add_argument("--tp-size", "--tensor-parallel-size", "--tp", dest="tp", type=int,
                   default=None, help="SGLang's --tp-size: the GPUs of the server, all nodes")
    p.add_argument("--nnodes", type=int, default=None,
                   help="SGLang's --nnodes (with --tp-size: GPUs per node = tp / nnodes)")
    p.add_argument("--dp-size", "--data-parallel-size", "--dp", dest="dp", type=int, default=1)
    p.add_argument("--attn-dp-size", "--attention-data-parallel-size", dest="attn_dp", type=int,
                   default=1)
    p.add_argument("--enable-dp-attention", action="store_true",
                   help="with --dp-size N: attention data-parallel (SGLang's deprecated spelling "
                   "of --attn-dp-size N)")
    p.add_argument("--gpus-per-node", type=int, default=None,
                   help=f"default {DEFAULTS.gpus_per_node}, or --tp-size / --nnodes")
    p.add_argument("--tokens-per-gpu", type=int, default=DEFAULTS.tokens_per_gpu,
                   help="decode: running sequences per GPU; prefill: batch tokens per GPU")
    p.add_argument("--context-len", type=int, default=DEFAULTS.context_len,
                   help="decode: KV length per sequence; prefill: prompt length per request")
    p.add_argument("--no-dp-attention", action="store_true",
                   help="attention tensor-parallel within a node instead of data-parallel (the "
                   "default without --tp-size is DP attention; with it, DP attention needs "
                   "--attn-dp-size or --enable-dp-attention --dp-size, as in SGLang)")
    p.add_argument("--tbo-token-distribution-threshold", type=float,
                   default=DEFAULTS.two_chunk_threshold, metavar="T",
                   help="two-chunk threshold in [0, 0.5], as the server accepts it")
    p.add_argument("--json", action="store_true", help="print the prediction as JSON")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw one layer's two-stream timeline per mode (needs matplotlib)")
    p.set_defaults(func=run)


def resolve_model(spec: str) -> ModelProfile:
    """A model profile from `--model-path`: a shipped name or alias, the Hugging Face id of one
    (by its last path part), a directory with config.json, or a model JSON."""
    base = spec.rstrip("/").rsplit("/", 1)[-1].lower()
    config = Path(spec) / "config.json"
    if config.is_file():
        return model_from_hf_config(json.loads(config.read_text()), name=base)
    if not spec.endswith(".json") and "/" in spec and (
            base in MODEL_NAMES or base in MODEL_ALIASES):
        return load_model(base)
    return load_model(spec)


def deployment(args: argparse.Namespace, model: ModelProfile) -> Deployment:
    """The deployment `args` describe, with the server's own range checks (ProfileError)."""
    for flag, value in (("--tp-size", args.tp), ("--ep-size", args.ep), ("--nnodes", args.nnodes),
                        ("--dp-size", args.dp), ("--attn-dp-size", args.attn_dp),
                        ("--gpus-per-node", args.gpus_per_node)):
        if value is not None and value < 1:
            raise ProfileError(f"{flag} must be >= 1 (got {value})")
    ep = args.ep if args.ep is not None else (args.tp or DEFAULTS.ep_size)
    per_node = args.gpus_per_node or DEFAULTS.gpus_per_node
    dp_attention = not args.no_dp_attention
    if args.tp is not None:
        if args.tp % ep:
            raise ProfileError(f"--ep-size {ep} must divide --tp-size {args.tp}")
        nnodes = args.nnodes or 1
        if args.tp % nnodes:
            raise ProfileError(f"--nnodes {nnodes} must divide --tp-size {args.tp}")
        per_node = args.gpus_per_node or args.tp // nnodes
        attn_dp = max(args.attn_dp, args.dp if args.enable_dp_attention else 1)
        dp_attention = attn_dp > 1 and not args.no_dp_attention
    used = replicas_dispatched(enable_eplb=args.enable_eplb,
                               init_expert_location=args.init_expert_location,
                               ep_dispatch_algorithm=args.ep_dispatch_algorithm)
    check_expert_layout(model.num_experts, args.redundant, ep, model=model.name,
                        replicas_used=used)
    check_eplb(args.enable_eplb, ep)
    try:
        check_threshold(args.tbo_token_distribution_threshold)
    except ValueError as exc:
        raise ProfileError(str(exc)) from None
    return Deployment(phase=args.phase, ep_size=ep, gpus_per_node=per_node,
                      dp_attention=dp_attention, tokens_per_gpu=args.tokens_per_gpu,
                      context_len=args.context_len,
                      two_chunk_threshold=args.tbo_token_distribution_threshold,
                      num_redundant_experts=args.redundant, redundant_experts_used=used)


def expert_layout_error(values: Any) -> str | None:
    """For `check`: the refusal `plan` gives a server's expert layout (a parsed namespace or
    ServerArgs: --model-path, --ep-size / --tp-size and --moe-a2a-backend, the redundant
    experts, --enable-eplb), or None; also None for a model whose routed experts cannot be
    read here (not a shipped profile, no config.json in the directory, or no MoE)."""
    try:
        model = resolve_model(str(getattr(values, "model_path", "") or ""))
    except (ProfileError, ValueError, OSError):
        return None
    ep, ep_flag = server_ep_size(int(getattr(values, "ep_size", 1) or 1),
                                 int(getattr(values, "tp_size", 1) or 1),
                                 str(getattr(values, "moe_a2a_backend", "none") or "none"))
    try:
        check_expert_layout(model.num_experts,
                            int(getattr(values, "ep_num_redundant_experts", 0) or 0), ep,
                            model=model.name, ep_flag=ep_flag)
        check_eplb(bool(getattr(values, "enable_eplb", False)), ep)
    except ProfileError as exc:
        return str(exc)
    return None


def to_json(pred: Prediction) -> dict[str, Any]:
    modes = {
        name: {"applicable": e.applicable, "note": e.note, "layer_us": round(e.layer_us, 2),
               "step_ms": round(e.step_us / 1e3, 3),
               "throughput_per_gpu": round(e.throughput_per_gpu, 2),
               "gain_vs_none": round(e.gain_vs_none, 5)}
        for name, e in pred.estimates.items()
    }
    layout = layout_of(pred.model, pred.deployment)
    return {"model": pred.model.name, "gpu": pred.hardware.name,
            "deployment": dataclasses.asdict(pred.deployment), "modes": modes,
            "experts": {"routed": layout.routed, "redundant": layout.redundant,
                        "physical": layout.physical, "per_gpu": layout.per_rank,
                        "redundant_receive_tokens": layout.replicas_used,
                        "note": idle_replicas_note(layout)},
            "recommended": pred.recommended, "hardware_source": pred.hardware.source}


def describe(pred: Prediction) -> str:
    d = pred.deployment
    attn = "DP attention" if d.dp_attention else f"attention TP{d.attn_tp_size}"
    unit = "sequences" if d.phase == Phase.DECODE else "tokens"
    layout = layout_of(pred.model, d)
    return (f"{pred.model.name} {d.phase} on {pred.hardware.name}: EP{d.ep_size} over "
            f"{d.num_nodes} node(s) x {d.gpus_per_node} GPUs, {experts_per_gpu(layout)}, "
            f"{attn}, {d.tokens_per_gpu} {unit}/GPU, context {d.context_len}")


def experts_per_gpu(layout: ExpertLayout) -> str:
    return (f"{layout.per_rank} experts/GPU ({layout.routed} routed + {layout.redundant} "
            "redundant)")


def table(pred: Prediction) -> str:
    kind = "output" if pred.deployment.phase == Phase.DECODE else "input"
    lines = [describe(pred), "",
             f"{'mode':<10} {'MoE layer':>11} {'step':>11} {kind + ' tok/s/GPU':>17} "
             f"{'gain vs none':>13}"]
    for e in pred.estimates.values():
        if not e.applicable:
            lines.append(f"{e.mode:<10} {'n/a':>11}   ({e.note})")
            continue
        mark = "  <- recommended" if e.mode == pred.recommended else ""
        lines.append(f"{e.mode:<10} {e.layer_us:>8.1f} us {e.step_us / 1e3:>8.2f} ms "
                     f"{e.throughput_per_gpu:>17.1f} {e.gain_vs_none:>+12.1%}{mark}")
    best = pred.estimates[pred.recommended]
    note = idle_replicas_note(layout_of(pred.model, pred.deployment))
    lines += [f"note: {note}"] if note else []
    lines += ["", f"recommended: {pred.recommended}"
              + (f" ({best.gain_vs_none:+.1%} throughput over none)" if best.mode != Mode.NONE else
                 " (no overlap mode is predicted to pay here)"),
              f"hardware profile: {pred.hardware.source}"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        model = resolve_model(args.model)
        hw = load_hardware(args.gpu)
        deploy = deployment(args, model)
        pred = predict(model, hw, deploy, PLAN_MODES, timelines=bool(args.plot))
    except (ProfileError, ValueError) as exc:
        print(f"sglang-overlap plan: error: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        from sglang_overlap.cli.timeline import draw_timelines

        draw_timelines(pred, args.plot, title=describe(pred))
    if args.json:
        out = to_json(pred)
        if args.plot:
            out["plot"] = args.plot
        print(json.dumps(out, indent=2))
    else:
        print(table(pred))
        if args.plot:
            print(f"timeline: {args.plot}")
    return 0
