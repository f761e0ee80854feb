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
# repository path), each with its test file and the file whose dict of server configurations
# holds the server cases.
SUITES = {
    "overlap servers": ("tests/e2e/test_overlap_servers.py", "tests/e2e/overlap_runs.py"),
    "graph servers": ("tests/e2e/test_graph_servers.py", "tests/e2e/graph_runs.py"),
    "gating servers": ("tests/e2e/test_gating.py", "benchmarks/bench_gating.py"),
    "DeepSeek-V2 servers": ("tests/e2e/test_model_servers.py",) * 2,
}


def _suites(proof: str) -> list[tuple[str, list[str]]]:
    """(suite, its server cases) per part of a cell's proof: `suite (`case`, `case` ...)`."""
    return [(suite, re.findall(r"`(\w+)`", rest))
            for suite, rest in re.findall(r"([A-Za-z][\w -]*?)(?: \(([^)]*)\))?(?:, |$)", proof)]


def _assert_proven_by_tests_that_exist(arch: str, what: str, proof: str) -> None:
    for suite, cases in _suites(proof):
        assert suite in SUITES, f"{arch=} {what=} {proof=}: unknown suite {suite!r}"
        test, configs = (REPO / path for path in SUITES[suite])
        assert test.is_file(), f"{arch=} {what=} {test=}"
        for case in cases:  # a server configuration the suite's tests name
            assert f'"{case}"' in test.read_text(), f"{arch=} {what=} {case=} {test=}"
            assert re.search(rf'\n +"{case}": ', configs.read_text()), (
                f"{arch=} {what=} {case=}: no server configuration in {configs}")


@pytest.mark.parametrize(("proof", "parts"), [
    ("overlap servers (`tbo`), graph servers",
     [("overlap servers", ["tbo"]), ("graph servers", [])]),
    ("DeepSeek-V2 servers (`dsv2_tbo`: the long prompt is cut in two)",
     [("DeepSeek-V2 servers", ["dsv2_tbo"])]),
    ("graph servers (`a`, `b`), gating servers", [("graph servers", ["a", "b"]),
                                                   ("gating servers", [])]),
])
def test_a_proof_names_its_suites_and_every_case(proof: str, parts: list) -> None:
    assert _suites(proof) == parts


@pytest.mark.parametrize("arch", ["DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"])
def test_deepseek_is_proven_in_every_mode_by_a_test_that_exists(arch: str) -> None:
    row = next(r for r in TABLE if r.name == arch)
    assert set(row.proven) == set(MODES)
    for mode, proof in row.proven.items():
        _assert_proven_by_tests_that_exist(arch, mode, proof)


@pytest.mark.parametrize("arch", ["DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"])
def test_deepseek_is_proven_on_deepep_by_server_cases_that_exist(arch: str) -> None:
    row = next(r for r in TABLE if r.name == arch)
    assert set(row.a2a_backends) == {"deepep"}, row.a2a_backends
    proof = row.a2a_backends["deepep"]
    assert all(cases for _, cases in _suites(proof)), proof  # named server cases, not suites
    _assert_proven_by_tests_that_exist(arch, "deepep", proof)


def test_no_other_architecture_is_proven_on_another_backend() -> None:
    assert [r.name for r in TABLE if r.a2a_backends] == ["DeepseekV3ForCausalLM",
                                                          "DeepseekV2ForCausalLM"]


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
    assert architecture_of({"architectures": "DeepseekV3ForCausalLM"}) == "DeepseekV3ForCausalLM"


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
