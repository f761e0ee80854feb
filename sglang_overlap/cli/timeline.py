"""Draw one MoE layer's two-stream timeline per overlap mode (for `sglang-overlap plan --plot`).

The only module that imports matplotlib, and only when called. Each mode gets a panel with two
rows: "compute" (the SMs' in-order stream) and "comm" (data in flight between GPUs). Bars are
coloured by micro-batch (A, B) and labelled with the stage; the panel spans one steady-state
layer period, so idle gaps on the compute row are time the mode loses to waiting.
"""

from __future__ import annotations

from pathlib import Path

from sglang_overlap.planning.cost.cost_model import Prediction

_COLORS = {0: "#4C78A8", 1: "#F58518"}
_ROWS = {"compute": 1.0, "comm": 0.0}
_SHORT = {"attn_prep": "attn prep", "attn_core": "attention", "dispatch_send": "d.send",
          "dispatch_recv": "d.recv", "combine_send": "c.send", "combine_recv": "c.recv",
          "gate_up": "gate-up", "dispatch": "dispatch", "combine": "combine"}


def draw_timelines(pred: Prediction, path: str | Path, title: str = "") -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise SystemExit("sglang-overlap plan --plot needs matplotlib: pip install "
                         "'sglang-overlap[plot]' (or pip install matplotlib)") from exc
    modes = [e for e in pred.estimates.values() if e.applicable]
    width = max(e.layer_us for e in modes)
    fig, axes = plt.subplots(len(modes), 1, figsize=(13, 1.7 * len(modes) + 1.2), sharex=True,
                             squeeze=False)
    for ax, est in zip(axes[:, 0], modes, strict=True):
        for seg in est.timeline:
            dur = seg.end_us - seg.start_us
            if dur <= 0:
                continue
            y = _ROWS[seg.stream]
            ax.barh(y, dur, left=seg.start_us, height=0.7, color=_COLORS[seg.micro_batch % 2],
                    edgecolor="black", linewidth=0.4, hatch="//" if seg.stream == "comm" else None,
                    alpha=0.85 if seg.stream == "compute" else 0.6)
            label = _SHORT.get(seg.name, seg.name)
            if dur > width * 0.045:
                ax.text(seg.start_us + dur / 2, y, label, ha="center", va="center", fontsize=7,
                        clip_on=True)
        ax.axvline(est.layer_us, color="red", linestyle="--", linewidth=0.8)
        ax.set_yticks(list(_ROWS.values()), list(_ROWS))
        ax.set_ylim(-0.6, 1.6)
        ax.set_xlim(0, width * 1.02)
        tag = " (recommended)" if est.mode == pred.recommended else ""
        ax.set_title(f"{est.mode}{tag}: {est.layer_us:.0f} us per MoE layer, "
                     f"{est.gain_vs_none:+.1%} throughput vs none", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("microseconds within one steady-state MoE layer")
    fig.legend(handles=[Patch(color=_COLORS[0], label="micro-batch A / whole batch"),
                        Patch(color=_COLORS[1], label="micro-batch B"),
                        Patch(facecolor="white", edgecolor="black", hatch="//",
                              label="comm: data in flight")],
               loc="upper right", fontsize=8, ncol=3)
    fig.suptitle(title or "one MoE layer per overlap mode", fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
