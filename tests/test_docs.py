"""The docs against the code: docs/architecture.md's hook table lists exactly the hooks the plugin
registers (target, kind, feature, glue file), every repository path the docs write in backticks
exists, every relative link resolves, and docs/gating.md's flag table matches the settings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
ARCHITECTURE = DOCS / "architecture.md"
HEADER = ["target", "kind", "feature", "glue file", "why"]

# `a/b.py`, `a/b/`: a path (word characters, dots, dashes and slashes only) with a '/' that ends
# in a file suffix the repository uses or in '/' (a folder). Globs and placeholders do not match;
# hidden folders (`.whl/`, `.deepep/`) are git-ignored places a script fills, not repository paths.
PATH = re.compile(r"`([\w.\-]+(?:/[\w.\-]+)*(?:\.(?:py|md|json|toml)|/))`")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _hook_table() -> list[tuple[str, str, str, str]]:
    """(target, kind, feature, glue file) per row of the table headed by HEADER."""
    lines = ARCHITECTURE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("|") and _cells(line) == HEADER)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        target, kind, feature, glue, _why = _cells(line)
        rows.append((target.strip("`"), kind, feature, glue.strip("`")))
    return rows


def _short(target: str) -> str:
    return ".".join(target.split(".")[-2:])


def test_the_hook_table_lists_exactly_the_registered_hooks() -> None:
    from tests.conftest import require_module

    require_module("sglang.srt.plugins.hook_registry")
    from sglang_overlap.sglang import hooks

    expected = []
    for name in hooks.GLUE_MODULES:
        module = hooks._glue(name)  # noqa: SLF001 - the registry's own import
        expected += [(_short(s.target), s.kind, s.feature + (", CPU only" if s.cpu_only else ""),
                      f"upstream/{name}.py") for s in module.HOOKS]
        expected += [(_short(s.step_target), "resolution", s.feature, f"upstream/{name}.py")
                     for s in getattr(module, "RESOLUTION_HOOKS", ())]
    assert len({t for t, *_ in expected}) == len(expected), "two targets share a table name"
    table = _hook_table()
    assert sorted(table) == sorted(expected), (
        f"missing from the table: {sorted(set(expected) - set(table))}; "
        f"not registered: {sorted(set(table) - set(expected))}")
    assert not any(kind == "replace" for _, kind, _, _ in table)


def _doc_paths() -> list[tuple[str, str]]:
    return [(md.name, m) for md in sorted(DOCS.glob("*.md"))
            for m in PATH.findall(md.read_text()) if "/" in m and not m.startswith(".")]


def _exists(path: str) -> bool:
    """A path from the repository root, the package's (`planning/two_chunk.py` means
    `sglang_overlap/planning/two_chunk.py`) or the glue's (`upstream/dp_attn.py`)."""
    roots = [REPO, REPO / "sglang_overlap", REPO / "sglang_overlap" / "sglang"]
    return any((root / path).exists() for root in roots)


def test_the_docs_write_repository_paths() -> None:
    assert len(_doc_paths()) > 20  # the pattern still finds the docs' paths


@pytest.mark.parametrize(("doc", "path"), _doc_paths())
def test_every_path_in_the_docs_exists(doc: str, path: str) -> None:
    assert _exists(path), f"docs/{doc} names `{path}`, which is not in the repository"


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _doc_links() -> list[tuple[str, str]]:
    return [(md.name, t.split("#")[0]) for md in sorted(DOCS.glob("*.md"))
            for t in LINK.findall(md.read_text()) if not t.startswith(("http", "#"))]


def test_the_docs_link_each_other() -> None:
    assert len(_doc_links()) > 5  # the pattern still finds the docs' links


@pytest.mark.parametrize(("doc", "target"), _doc_links())
def test_every_relative_link_in_the_docs_resolves(doc: str, target: str) -> None:
    assert (DOCS / target).resolve().is_file(), f"docs/{doc} links to {target}, which is missing"


def test_the_gating_flag_table_matches_the_settings() -> None:
    from tests.test_readme import expected_defaults, table_defaults

    section = (DOCS / "gating.md").read_text().split("## The tuning flags", 1)[1].split("\n## ")[0]
    table = table_defaults(section)
    expected = expected_defaults()
    assert {"--overlap-gating-hysteresis", "--overlap-gating-explore", "--overlap-gating-trials",
            "--overlap-gating-sync-steps", "--overlap-hardware-profile"} == set(table)
    for flag, default in table.items():
        want = expected[flag]
        assert default == want, f"{flag=} gating.md={default!r} settings={want!r}"
