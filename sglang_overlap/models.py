"""Which model architectures each overlap mode is proven on, and the refusal for the others.

A cell is either proven - a tiny random instance of the architecture served by a real server of the
supported SGLang on CPU answers token for token as the same server without the plugin, and the
mode's path is seen running (the end-to-end server case named in the cell) - or refused when the
server starts, naming the architecture and the mode. No cell is allowed without proof: an
architecture missing from `TABLE` is refused for every mode (SBO can run silently wrong on a model
whose layers lack the matching operation strategy).

One source for the README's table (`markdown_table`, compared with README.md by a test), for the
server (`sglang/server_args.py` refuses at argument parsing when the model's config.json is on
this machine, `sglang/model_config.py` when SGLang builds the model config) and for
`sglang-overlap check`. Plain Python: no torch, no sglang.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_overlap.modes import Feature

Mode = Feature  # what a model is proven in: the overlap modes, the selector and torch_a2a

MODES: dict[Mode, str] = {
    Feature.TBO: "--enable-two-batch-overlap (TBO)",
    Feature.TWO_CHUNK: "two-chunk (TBO with --tbo-token-distribution-threshold > 0)",
    Feature.SBO: "--enable-single-batch-overlap (SBO)",
    Feature.GATE: "--overlap-gating auto",
    Feature.TORCH_A2A: "--moe-a2a-backend torch_a2a",
}
"""Each mode, as the flags that ask for it."""

# Each cell names the end-to-end suites that prove it, with the server case in backticks: the
# overlap servers (DeepSeek-V3, every mode), the CUDA-graph servers, the gating servers and the
# DeepSeek-V2 servers.
_DSV3_PROOF: dict[Mode, str] = {
    Feature.TBO: "overlap servers (`tbo`), graph servers",
    Feature.TWO_CHUNK: "overlap servers (`tbo`: the long prompt is cut in two)",
    Feature.SBO: "overlap servers (`sbo`), graph servers (DeepEP stand-ins)",
    Feature.GATE: "overlap servers (`auto`), gating servers",
    Feature.TORCH_A2A: "overlap servers (`a2a`)",
}
_DSV2_PROOF: dict[Mode, str] = {
    Feature.TBO: "DeepSeek-V2 servers (`dsv2_tbo`)",
    Feature.TWO_CHUNK: "DeepSeek-V2 servers (`dsv2_tbo`: the long prompt is cut in two)",
    Feature.SBO: "DeepSeek-V2 servers (`dsv2_sbo`)",
    Feature.GATE: "DeepSeek-V2 servers (`dsv2_auto`)",
    Feature.TORCH_A2A: "DeepSeek-V2 servers (every overlap server)",
}


@dataclass(frozen=True)
class Architecture:
    """One row: an HF `architectures[0]` and, per mode, the end-to-end suites and server case
    that prove it (absent: refused at start, for `why`)."""

    name: str
    models: str
    proven: Mapping[Mode, str] = field(default_factory=dict)
    why: str = ""
    a2a_backends: Mapping[str, str] = field(default_factory=dict)
    """Each --moe-a2a-backend besides SGLang's default and torch_a2a (a mode above) that the
    plugin's modes are proven on with this architecture, with the suites and server cases that
    prove it (through the kit's stand-ins: the tokens of the server without the plugin)."""


TABLE: tuple[Architecture, ...] = (
    Architecture("DeepseekV3ForCausalLM", "DeepSeek-V3, DeepSeek-R1", _DSV3_PROOF,
                 a2a_backends={"deepep": "graph servers (`deepep_graphs_tbo`, "
                                         "`deepep_graphs_sbo_shared`, "
                                         "`deepep_graphs_sbo_expert`)"}),
    Architecture("DeepseekV2ForCausalLM", "DeepSeek-V2, DeepSeek-V2-Lite", _DSV2_PROOF,
                 a2a_backends={"deepep": "DeepSeek-V2 servers (`dsv2_deepep_tbo`, "
                                         "`dsv2_deepep_sbo`)"}),
    Architecture(
        "Qwen3MoeForCausalLM", "Qwen3-30B-A3B, Qwen3-235B-A22B", {},
        "SGLang's Qwen3-MoE has its own MoE layer and TBO operation strategy; the plugin's "
        "per-step SBO switch covers DeepseekV2MoE layers only, and no Qwen3-MoE has run in a CPU "
        "server with the plugin yet"),
)


def requested_modes(settings: Any) -> list[Mode]:
    """The modes an `OverlapSettings` asks for, in `MODES` order."""
    asked: dict[Mode, bool] = {
        Feature.TBO: settings.enable_two_batch_overlap,
        Feature.TWO_CHUNK: settings.two_chunk_enabled,
        Feature.SBO: settings.enable_single_batch_overlap,
        Feature.GATE: settings.overlap_gating == "auto",
        Feature.TORCH_A2A: settings.requested_a2a_backend == "torch_a2a",
    }
    return [m for m in MODES if asked[m]]


def architecture_of(config: Mapping[str, Any]) -> str | None:
    """`architectures[0]` of an HF config dict (None: the config names none)."""
    archs = config.get("architectures") or []
    if isinstance(archs, str):  # a malformed config naming one architecture as a string
        return archs
    return str(archs[0]) if archs else None


def refusal(architecture: str | None, modes: list[Mode]) -> str | None:
    """The SettingsError text for serving `architecture` with `modes`; None when every mode
    is proven on it."""
    row = next((r for r in TABLE if r.name == architecture), None)
    unproven = [m for m in modes if row is None or m not in row.proven]
    if not unproven:
        return None
    proven_on = [r.name for r in TABLE if all(m in r.proven for m in unproven)]
    why = row.why if row is not None else "not in the plugin's table of proven models"
    return (f"sglang-overlap: {', '.join(MODES[m] for m in unproven)} is not supported on "
            f"{architecture or 'a model whose config names no architecture'} ({why}); proven "
            f"on: {', '.join(proven_on) or 'none'}. Start without "
            f"{'these flags' if len(unproven) > 1 else 'this flag'} (see README, 'Supported "
            "models')")


def markdown_table() -> str:
    """The table as README.md shows it."""
    head = ["architecture", "models", *(MODES[m].split(" (")[0] for m in MODES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in TABLE:
        cells = ["proven" if m in r.proven else "refused at start" for m in MODES]
        lines.append(f"| `{r.name}` | {r.models} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = ["MODES", "TABLE", "Architecture", "architecture_of", "markdown_table", "refusal",
           "requested_modes"]
