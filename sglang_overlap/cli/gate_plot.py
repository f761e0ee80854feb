"""Draw what a server's --overlap-gating auto learned (for `sglang-overlap gate --plot`).

One panel per phase: for each token bucket (the busiest rank's tokens per step), a bar per
measured mode with its mean step time and sample count; the bucket's column is shaded in the
colour of its fastest measured mode, the one the gate serves there once the modes are measured
(it switches only for a gain above --overlap-gating-hysteresis). `plot_data` is plain Python;
`draw_gate` imports matplotlib, and only when called.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_overlap.modes import PHASES, Mode

BAR_ORDER = (Mode.NONE, Mode.TBO, Mode.TWO_CHUNK, Mode.SBO)  # in each bucket
_COLORS: dict[str, str] = {Mode.NONE: "#7F7F7F", Mode.TBO: "#4C78A8", Mode.TWO_CHUNK: "#F58518",
           Mode.SBO: "#54A24B"}


@dataclass(frozen=True)
class PhasePlot:
    """One phase's bars: buckets in token order; ms[mode][i] the mean step time in bucket i
    (None: not measured there), count[mode][i] its samples; chosen[i] the fastest mode."""

    phase: str
    buckets: tuple[str, ...]
    ms: dict[str, tuple[float | None, ...]]
    count: dict[str, tuple[int, ...]]
    chosen: tuple[str, ...]


def bucket_label(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi if hi < 1 << 62 else 'inf'}"


def plot_data(table: dict[str, Any]) -> list[PhasePlot]:
    """The bars of `table` (as GET /server_info serves it: rows of phase, tokens [lo, hi], mode,
    count, mean_ms), decode first; modes never measured in a phase are left out."""
    out = []
    for phase in PHASES:
        rows = [r for r in table["rows"] if r["phase"] == phase]
        if not rows:
            continue
        spans = sorted({tuple(r["tokens"]) for r in rows})
        index = {span: i for i, span in enumerate(spans)}
        modes: list[str] = [m for m in BAR_ORDER if any(r["mode"] == m for r in rows)]
        modes += sorted({r["mode"] for r in rows} - set(modes))
        ms: dict[str, list[float | None]] = {m: [None] * len(spans) for m in modes}
        count = {m: [0] * len(spans) for m in modes}
        for r in rows:
            i = index[tuple(r["tokens"])]
            ms[r["mode"]][i], count[r["mode"]][i] = float(r["mean_ms"]), int(r["count"])
        chosen = tuple(_fastest(ms, modes, i) for i in range(len(spans)))
        out.append(PhasePlot(phase, tuple(bucket_label(*s) for s in spans),
                             {m: tuple(v) for m, v in ms.items()},
                             {m: tuple(v) for m, v in count.items()}, chosen))
    return out


def _fastest(ms: dict[str, list[float | None]], modes: list[str], i: int) -> str:
    """The mode with the least mean step time in bucket i (the first of `modes` on a tie)."""
    measured = {m: v for m in modes if (v := ms[m][i]) is not None}
    return min(measured, key=measured.__getitem__)


def draw_gate(table: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """Write the plot of `table` to `path` (PNG, or any format matplotlib infers)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise SystemExit("sglang-overlap gate --plot needs matplotlib: pip install "
                         "'sglang-overlap[plot]' (or pip install matplotlib)") from exc
    phases = plot_data(table)
    if not phases:
        raise SystemExit("sglang-overlap gate --plot: the gate has measured no step yet")
    fig, axes = plt.subplots(len(phases), 1, figsize=(12, 3.2 * len(phases) + 0.8),
                             squeeze=False)
    for ax, ph in zip(axes[:, 0], phases, strict=True):
        width = 0.8 / len(ph.ms)
        for i, mode in enumerate(ph.chosen):
            ax.axvspan(i - 0.45, i + 0.45, color=_COLORS.get(mode, "#BBBBBB"), alpha=0.15)
        for j, (mode, values) in enumerate(ph.ms.items()):
            xs = [i - 0.4 + width * (j + 0.5) for i, v in enumerate(values) if v is not None]
            ys = [v for v in values if v is not None]
            ns = [n for n, v in zip(ph.count[mode], values, strict=True) if v is not None]
            ax.bar(xs, ys, width, color=_COLORS.get(mode, "#BBBBBB"), edgecolor="black",
                   linewidth=0.4, label=mode)
            for x, y, n in zip(xs, ys, ns, strict=True):
                ax.text(x, y, f"x{n}", ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(ph.buckets)), ph.buckets, rotation=45, fontsize=7)
        ax.set_xlim(-0.6, len(ph.buckets) - 0.4)
        ax.set_ylabel("mean step time (ms)")
        ax.set_title(f"{ph.phase}: step time per token bucket and mode (shade: fastest "
                     "measured, the mode served)", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("tokens on the busiest rank per step (bucket)")
    fig.legend(handles=[Patch(color=_COLORS[m], label=m) for m in BAR_ORDER],
               loc="upper right", fontsize=8, ncol=len(BAR_ORDER))
    fig.suptitle(title or "what --overlap-gating auto learned", fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
