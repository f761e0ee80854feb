"""`sglang-overlap plan`: predict each overlap mode's time for a deployment, and recommend one.

With no arguments it plans the embedded default deployment: DeepSeek-V3 decode on 2 x 8 H20,
DP16 + EP16, 32 sequences per GPU, 4096-token context (the setup of SGLang PR #9660's SBO result).
Imports only the pure-Python planning layer (no torch, no sglang): it answers in well under a
second; `--plot` imports matplotlib, and only then.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from sglang_overlap.planning.cost.cost_model import MODES, Prediction, predict
from sglang_overlap.planning.cost.profiles import (
    GPU_NAMES,
    MODEL_NAMES,
    Deployment,
    ProfileError,
    load_hardware,
    load_model,
)

DEFAULTS = Deployment()


def add_parser(subparsers: Any, name: str, help: str) -> None:  # noqa: A002 - dispatcher's API
    p = subparsers.add_parser(
        name, help=help, description=__doc__.split("\n\n")[0] + " Defaults: DeepSeek-V3 decode "
        "on 2x8 H20, EP16 with DP attention, 32 tokens per GPU, 4096-token context.")
    p.add_argument("--gpu", default="H20", metavar="GPU",
                   help=f"{', '.join(GPU_NAMES)}, or a profile JSON (e.g. one written by "
                        "benchmarks/calibrate.py, or {\"base\": \"H20\", ...} overrides)")
    p.add_argument("--model", default="deepseek-v3", metavar="MODEL",
                   help=f"{', '.join(MODEL_NAMES)} (alias deepseek-r1), or a model JSON")
    p.add_argument("--phase", choices=("decode", "prefill"), default=DEFAULTS.phase)
    p.add_argument("--ep", type=int, default=DEFAULTS.ep_size, help="expert-parallel size")
    p.add_argument("--gpus-per-node", type=int, default=DEFAULTS.gpus_per_node)
    p.add_argument("--tokens-per-gpu", type=int, default=DEFAULTS.tokens_per_gpu,
                   help="decode: running sequences per GPU; prefill: batch tokens per GPU")
    p.add_argument("--context-len", type=int, default=DEFAULTS.context_len,
                   help="decode: KV length per sequence; prefill: prompt length per request")
    p.add_argument("--no-dp-attention", action="store_true",
                   help="attention tensor-parallel within a node instead of data-parallel")
    p.add_argument("--tbo-token-distribution-threshold", type=float,
                   default=DEFAULTS.two_chunk_threshold, metavar="T",
                   help="two-chunk threshold used for the two_chunk estimate")
    p.add_argument("--json", action="store_true", help="print the prediction as JSON")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw one layer's two-stream timeline per mode (needs matplotlib)")
    p.set_defaults(func=run)


def to_json(pred: Prediction) -> dict[str, Any]:
    modes = {
        name: {"applicable": e.applicable, "note": e.note, "layer_us": round(e.layer_us, 2),
               "step_ms": round(e.step_us / 1e3, 3),
               "throughput_per_gpu": round(e.throughput_per_gpu, 2),
               "gain_vs_none": round(e.gain_vs_none, 5)}
        for name, e in pred.estimates.items()
    }
    return {"model": pred.model.name, "gpu": pred.hardware.name,
            "deployment": dataclasses.asdict(pred.deployment), "modes": modes,
            "recommended": pred.recommended, "hardware_source": pred.hardware.source}


def describe(pred: Prediction) -> str:
    d = pred.deployment
    attn = "DP attention" if d.dp_attention else f"attention TP{d.attn_tp_size}"
    unit = "sequences" if d.phase == "decode" else "tokens"
    return (f"{pred.model.name} {d.phase} on {pred.hardware.name}: EP{d.ep_size} over "
            f"{d.num_nodes} node(s) x {d.gpus_per_node} GPUs, {attn}, "
            f"{d.tokens_per_gpu} {unit}/GPU, context {d.context_len}")


def table(pred: Prediction) -> str:
    kind = "output" if pred.deployment.phase == "decode" else "input"
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
    lines += ["", f"recommended: {pred.recommended}"
              + (f" ({best.gain_vs_none:+.1%} throughput over none)" if best.mode != "none" else
                 " (no overlap mode is predicted to pay here)"),
              f"hardware profile: {pred.hardware.source}"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        model = load_model(args.model)
        hw = load_hardware(args.gpu)
        deploy = Deployment(
            phase=args.phase, ep_size=args.ep, gpus_per_node=args.gpus_per_node,
            dp_attention=not args.no_dp_attention, tokens_per_gpu=args.tokens_per_gpu,
            context_len=args.context_len,
            two_chunk_threshold=args.tbo_token_distribution_threshold)
        pred = predict(model, hw, deploy, MODES, timelines=bool(args.plot))
    except (ProfileError, ValueError) as exc:
        print(f"sglang-overlap plan: {exc}")
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
