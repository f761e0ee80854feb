"""The text the wheel ships states contracts only.

Every .py and .json under `sglang_overlap/` is scanned for what belongs in the repository, not in
an installed package: paths that exist only in a checkout (`benchmarks/`, `tests/`, `docs/`,
`patches/`, `.ci/`), dates, pull-request and issue numbers, and words of the project's process
("brief", "anecdote"). Measurement stories and validation tables live in `docs/` and
`benchmarks/results/`. The supported SGLang version is written once, in
`compat.SUPPORTED_SGLANG`; everything else formats that constant in.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_overlap.compat import SUPPORTED_SGLANG

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "sglang_overlap"

RULES: dict[str, re.Pattern[str]] = {
    "repository-only path": re.compile(r"(?<![\w.])(?:benchmarks|tests|docs|patches|\.ci)/"),
    "date": re.compile(r"(?<!\d)20\d\d-\d\d(?:-\d\d)?(?!\d)"),
    "pull request or issue number": re.compile(r"\bPR ?#?\d+|#\d{3,}|\bissues? #?\d+", re.I),
    "project-process word": re.compile(r"\b(?:brief|anecdot(?:e|es|al))\b", re.I),
}

PROVENANCE_DATE_KEY = "when"
"""A producer table's provenance records when it was measured (`planning.producer_tables`
requires the key): data about the numbers, so a date is allowed there and nowhere else."""

ALLOWED: dict[tuple[str, str], str] = {
    ("kernels/signal_deepgemm/__init__.py", "patches/"):
        "where the DeepGEMM signal patch lives: rewritten with its packaging",
    ("kernels/signal_deepgemm/headers.py", "patches/"):
        "where the DeepGEMM signal patch lives: rewritten with its packaging",
    ("kernels/signal_deepgemm/versions.py", "patches/"):
        "where the DeepGEMM signal patch lives: rewritten with its packaging",
}
"""(file under the package, matched text) -> why it may stay for now. An entry that matches
nothing fails: delete it once the text is gone."""

# The version's digits, not inside a longer version ("10.5.23", "0.5.231").
VERSION = re.compile(rf"(?<![\w.]){re.escape(SUPPORTED_SGLANG)}(?![\w.]*\d)")
VERSION_HOME = "compat.py"


def findings(text: str) -> list[tuple[str, str]]:
    """(rule, matched text) for every rule violation in `text`."""
    return [(rule, m.group(0)) for rule, pattern in RULES.items()
            for m in pattern.finditer(text)]


def _json_strings(value: object, key: str = "", parent: str = "") -> Iterator[tuple[str, str,
                                                                                   str]]:
    """(parent key, key, text) of every key and string value in a JSON document."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield key, k, k
            yield from _json_strings(v, k, key)
    elif isinstance(value, list):
        for v in value:
            yield from _json_strings(v, key, parent)
    elif isinstance(value, str):
        yield parent, key, value


def file_findings(path: Path) -> list[tuple[int | str, str, str]]:
    """(line number, or the JSON key holding the text; rule; matched text) for one file."""
    text = path.read_text("utf-8")
    if path.suffix != ".json":
        return [(number, rule, found) for number, line in enumerate(text.splitlines(), 1)
                for rule, found in findings(line)]
    out: list[tuple[int | str, str, str]] = []
    for parent, key, value in _json_strings(json.loads(text)):
        for rule, found in findings(value):
            provenance_date = (rule == "date" and key == PROVENANCE_DATE_KEY
                               and parent == "provenance")
            if not provenance_date:
                out.append((f"{parent}.{key}", rule, found))
    return out


def shipped_files(root: Path) -> list[Path]:
    """Every .py and .json under `root`, links to folders not followed."""
    return sorted(Path(folder) / name for folder, _, names in os.walk(root)
                  for name in names if name.endswith((".py", ".json")))


def scan(root: Path) -> tuple[list[str], set[tuple[str, str]]]:
    """(every finding not in ALLOWED as `file:where: rule: text`, the ALLOWED entries used)."""
    problems, used = [], set()
    for path in shipped_files(root):
        rel = path.relative_to(root).as_posix()
        for where, rule, found in file_findings(path):
            if (rel, found) in ALLOWED:
                used.add((rel, found))
            else:
                problems.append(f"{rel}:{where}: {rule}: {found!r}")
    return problems, used


def version_files(root: Path) -> dict[str, int]:
    """file -> how many times the supported SGLang version is written in it."""
    counts = {path.relative_to(root).as_posix(): len(VERSION.findall(path.read_text("utf-8")))
              for path in shipped_files(root)}
    return {rel: n for rel, n in counts.items() if n}


def test_the_package_ships_contracts_only() -> None:
    files = shipped_files(PACKAGE)
    assert len(files) > 100 and any(f.suffix == ".json" for f in files)  # the walk finds them
    problems, used = scan(PACKAGE)
    assert not problems, "text that belongs in the repository, not the wheel:\n" + "\n".join(
        problems)
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED entries that match nothing any more (delete them): {stale}"


def test_the_supported_sglang_version_is_written_once() -> None:
    assert version_files(PACKAGE) == {VERSION_HOME: 1}


PLANTED = [
    ("see benchmarks/calibrate.py", "repository-only path", "benchmarks/"),
    ("checked by tests/planning/test_x.py", "repository-only path", "tests/"),
    ("(`docs/planning.md`)", "repository-only path", "docs/"),
    ("the patch under patches/deep_gemm/", "repository-only path", "patches/"),
    ("run .ci/run", "repository-only path", ".ci/"),
    ("measured 2026-12-05 on one H200", "date", "2026-12-05"),
    ("since 2025-05", "date", "2025-05"),
    ("SGLang PR #9660 measured", "pull request or issue number", "PR #9660"),
    ("see pr 123", "pull request or issue number", "pr 123"),
    ("(SGLang #36840)", "pull request or issue number", "#36840"),
    ("served until issue 35", "pull request or issue number", "issue 35"),
    ("the project brief quotes -27%", "project-process word", "brief"),
    ("an anecdote from the cluster", "project-process word", "anecdote"),
]


@pytest.mark.parametrize(("text", "rule", "found"), PLANTED)
def test_each_rule_catches_its_planted_case(text: str, rule: str, found: str) -> None:
    assert findings(text) == [(rule, found)], f"{text=} {findings(text)=}"


@pytest.mark.parametrize("text", [
    "sglang_overlap/profiles/producer-H200.json",
    "kernels/deepgemm_patches links to the patch",
    "`planning/cost/cost_model.py` and `kernels/signal_deepgemm/`",
    "briefly, the rows past masked_m",
    "issued A, B, A, B; the issue order",
    "E8M32=42.6us, sgl-deep-gemm 0.2.3.post2, driver 580.159.04",
    "[E * 128] int32, #1f77b4, step 2048-token prompts",
])
def test_contract_text_is_not_flagged(text: str) -> None:
    assert findings(text) == [], f"{text=}"


def _plant(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_file_scan_reads_python_and_json_and_names_where(tmp_path: Path) -> None:
    _plant(tmp_path, "a.py", '"""Contract."""\nX = 1  # from benchmarks/results/x.md\n')
    _plant(tmp_path, "sub/b.json", json.dumps({
        "t": {"provenance": {"when": "2026-12-05", "how": "sweep, issue 35"}},
        "source": "fitted 2026-12-02"}))
    _plant(tmp_path, "c.txt", "benchmarks/ is not scanned here")
    problems, _ = scan(tmp_path)
    assert problems == ["a.py:2: repository-only path: 'benchmarks/'",
                        "sub/b.json:provenance.how: pull request or issue number: 'issue 35'",
                        "sub/b.json:.source: date: '2026-12-02'"], problems


def test_the_version_count_sees_a_second_copy(tmp_path: Path) -> None:
    _plant(tmp_path, VERSION_HOME, f'SUPPORTED_SGLANG = "{SUPPORTED_SGLANG}"\n')
    assert version_files(tmp_path) == {VERSION_HOME: 1}
    _plant(tmp_path, "glue.py", f'"""Glue to SGLang {SUPPORTED_SGLANG}."""\n')
    _plant(tmp_path, "p.json", json.dumps({"pin": f"sglang=={SUPPORTED_SGLANG}"}))
    _plant(tmp_path, "other.py", f'V = "1{SUPPORTED_SGLANG}", "{SUPPORTED_SGLANG}1"\n')
    assert version_files(tmp_path) == {VERSION_HOME: 1, "glue.py": 1, "p.json": 1}
