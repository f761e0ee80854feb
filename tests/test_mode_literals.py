"""No overlap mode or step phase is named by a string literal outside `sglang_overlap/modes.py`.

Read from the package's source (docstrings aside): "tbo", "sbo" and "two_chunk" appear nowhere
else; "decode" and "prefill" only where they name something else (a prefill/decode server of a PD
deployment, SGLang's forward kinds); "none" only where it is another flag's value or a word in a
message, each counted per file below, so a new one must be looked at and added on purpose.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sglang_overlap"
OWNER = PACKAGE / "modes.py"
MODES_ONLY = frozenset({"tbo", "sbo", "two_chunk"})
PHASES = frozenset({"decode", "prefill"})
# file -> {literal: count}: the uses that name something other than a mode or a phase
ALLOWED: dict[str, dict[str, int]] = {
    # --moe-a2a-backend's "none" (its default and choices)
    "settings.py": {"none": 3},
    "cli/check.py": {"none": 1},  # --moe-a2a-backend none
    "cli/check_sections.py": {"none": 1},  # "none" forms in the kernels line
    "cli/check_flags.py": {"none": 2},
    "cli/check_text.py": {"none": 1},  # no compatibility row matched
    "cli/plan.py": {"none": 2},  # --moe-a2a-backend none, in check's expert-layout check
    "sglang/upstream/server_args.py": {"none": 2},
    "compat.py": {"none": 3},  # the compatibility table's cells
    "models.py": {"none": 1},  # no architecture proven
    "planning/sbo_path.py": {"none": 1},  # no SBO path
    "sglang/upstream/metrics_collector.py": {"none": 4},  # versions, the down-GEMM producer
    # the signal GEMM's signal form ("none": no signals)
    "kernels/signal_deepgemm/build.py": {"none": 1},
    "kernels/signal_deepgemm/configs.py": {"none": 2},
    "kernels/signal_deepgemm/launch.py": {"none": 2},
    # the servers of a prefill/decode deployment (`launch`), not step phases
    "launch/config.py": {"prefill": 8, "decode": 8},
    "launch/commands.py": {"prefill": 1, "decode": 1},
    "planning/two_batch.py": {"decode": 1},  # SGLang's forward kinds
}


def literals(source: str) -> Counter[str]:
    """Counts of the mode and phase names among `source`'s string constants, docstrings aside."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    names = MODES_ONLY | PHASES | {"none"}
    return Counter(node.value for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)
                   and node.value in names and id(node) not in docstrings)


def problems(relative: str, found: Counter[str]) -> list[str]:
    allowed = ALLOWED.get(relative, {})
    return [f"{relative}: {n} x {name!r} (allowed {allowed.get(name, 0)}): name it through "
            f"sglang_overlap.modes" for name, n in sorted(found.items())
            if n > allowed.get(name, 0) or name in MODES_ONLY]


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p != OWNER)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_mode_literal_outside_the_owner(path: Path) -> None:
    relative = str(path.relative_to(PACKAGE))
    assert problems(relative, literals(path.read_text())) == []


def test_the_allowances_are_all_used() -> None:
    """An allowance no longer needed is dropped, so it cannot hide a new literal."""
    for relative, allowed in ALLOWED.items():
        found = literals((PACKAGE / relative).read_text())
        for name, n in allowed.items():
            assert found[name] == n, (relative, name, found[name], n)


@pytest.mark.parametrize("snippet", [
    'if decision.mode == "tbo":\n    pass\n',
    'MODES = ("none", "tbo", "sbo")\n',
    'x = {"two_chunk": 1}\n',
    'def f(phase):\n    return phase == "prefill"\n',
    'label = f"{out[\'sbo\']}"\n',
])
def test_a_planted_literal_is_caught(snippet: str) -> None:
    assert problems("cli/plan.py", literals(snippet))


def test_docstrings_and_other_words_are_not_literals() -> None:
    src = '"""tbo and sbo, in prose."""\ndef f():\n    """decode."""\n    return "tbo_x"\n'
    assert not literals(src)
    assert problems("settings.py", literals('a = "none"\n')) == []
    assert problems("settings.py", literals('a, b, c, d = "none", "none", "none", "none"\n'))
