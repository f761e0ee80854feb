"""The supported-models table (`sglang_overlap/models.py`): every cell proven or refused, the
refusal naming the architecture and the mode, the README's table generated from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang_overlap.models import MODES, TABLE, markdown_table, refusal, requested_modes
from sglang_overlap.settings import OverlapSettings

README = Path(__file__).resolve().parent.parent / "README.md"
REPO = README.parent


def test_the_readme_shows_the_table() -> None:
    assert markdown_table() in README.read_text()


# The end-to-end suites a cell may name (models.py names them in words: the wheel carries no
# repository path), each with its test file.
SUITES = {
    "overlap servers": "tests/e2e/test_overlap_servers.py",
    "graph servers": "tests/e2e/test_graph_servers.py",
    "gating servers": "tests/e2e/test_gating.py",
    "DeepSeek-V2 servers": "tests/e2e/test_model_servers.py",
}


def _suites(proof: str) -> list[tuple[str, str | None]]:
    """(suite, server case or None) per comma-separated part of a cell's proof."""
    parts = []
    for part in proof.split(", "):
        suite, _, rest = part.partition(" (")
        case = re.search(r"`(\w+)`", rest)
        parts.append((suite, case.group(1) if case else None))
    return parts


@pytest.mark.parametrize("arch", ["DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"])
def test_deepseek_is_proven_in_every_mode_by_a_test_that_exists(arch: str) -> None:
    row = next(r for r in TABLE if r.name == arch)
    assert set(row.proven) == set(MODES)
    for mode, proof in row.proven.items():
        for suite, case in _suites(proof):
            assert suite in SUITES, f"{arch=} {mode=} {proof=}: unknown suite {suite!r}"
            path = REPO / SUITES[suite]
            assert path.is_file(), f"{arch=} {mode=} {path=}"
            if case is not None:
                assert f'"{case}"' in path.read_text(), f"{arch=} {mode=} {case=} {path=}"


@pytest.mark.parametrize("arch", ["Qwen3MoeForCausalLM", "MixtralForCausalLM", None])
@pytest.mark.parametrize("mode", list(MODES))
def test_every_unproven_cell_is_refused_naming_architecture_and_mode(arch: str | None,
                                                                    mode: str) -> None:
    why = refusal(arch, [mode])  # type: ignore[list-item]
    assert why is not None and why.startswith("sglang-overlap: ")
    assert MODES[mode] in why  # type: ignore[index]
    assert (arch or "names no architecture") in why
    assert ("; proven on: DeepseekV3ForCausalLM, DeepseekV2ForCausalLM. Start without this flag"
            in why)


def test_the_architecture_is_the_configs_first() -> None:
    from sglang_overlap.models import architecture_of

    assert architecture_of({"architectures": ["DeepseekV3ForCausalLM", "X"]}) == (
        "DeepseekV3ForCausalLM")
    assert architecture_of({"architectures": []}) is None and architecture_of({}) is None


def test_proven_cells_and_no_modes_pass() -> None:
    assert refusal("DeepseekV3ForCausalLM", list(MODES)) is None
    assert refusal("DeepseekV2ForCausalLM", list(MODES)) is None
    assert refusal("Qwen3MoeForCausalLM", []) is None


def test_only_the_unproven_modes_are_named() -> None:
    why = refusal("Qwen3MoeForCausalLM", ["tbo", "sbo"])
    assert why is not None
    assert "--enable-two-batch-overlap (TBO), --enable-single-batch-overlap (SBO) is" in why
    assert "Start without these flags" in why and "Qwen3-MoE" in why


@pytest.mark.parametrize(("changes", "modes"), [
    ({}, []),
    ({"enable_two_batch_overlap": True}, ["tbo", "two_chunk"]),
    ({"enable_two_batch_overlap": True, "tbo_token_distribution_threshold": 0.0}, ["tbo"]),
    ({"enable_single_batch_overlap": True, "overlap_gating": "auto"}, ["sbo", "gate"]),
    ({"requested_a2a_backend": "torch_a2a"}, ["torch_a2a"]),
])
def test_requested_modes(changes: dict, modes: list[str]) -> None:
    assert requested_modes(OverlapSettings(**changes)) == modes
