"""README.md as a new user reads it: a user guide within its size budget, the sections in order;
the first screen with the status line and the two commands for a fresh machine; an install that
starts from `pip install`; quick-start `check` and `serve` lines with the same flags; an Engine
example that sets SGLANG_OVERLAP_ARGS before Engine(); the flags table against the settings; the
GPU status against its results file; every local link resolving; no pointer to a setting the
server does not read."""

from __future__ import annotations

import dataclasses
import re
import shlex
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README_PATH = REPO / "README.md"
README = README_PATH.read_text(encoding="utf-8")
BUDGET = 14_000  # bytes (`wc -c README.md`): developer material goes to docs/
SECTIONS = ["Install (next to your SGLang 0.5.23)", "Quick start", "What is proven where",
            "Supported models", "Compatibility: what you get on your stack", "Flags", "Commands",
            "Troubleshooting"]
# Linked from the first screen: the developer material that lives in docs/, not here.
DEVELOPER_DOCS = ["docs/architecture.md", "docs/testing.md", "docs/glossary.md", "docs/measured.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else len(README)]


def _first_screen() -> str:
    return README[:README.index("\n## ")]


def _commands(text: str, program: str) -> list[list[str]]:
    """Indented command lines (backslash continuations joined) that start with `program`."""
    joined = re.sub(r"\\\n\s+", " ", text)
    return [shlex.split(line.split("#")[0]) for line in joined.splitlines()
            if line.startswith("    " + program)]


def _words(text: str) -> str:
    return " ".join(text.split())


def table_defaults(text: str) -> dict[str, str]:
    """{flag: default cell} from a `| flag | default | meaning |` table; a row naming several
    flags gives their defaults comma-separated, in the same order."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| `--")]
    out: dict[str, str] = {}
    for cells in rows:
        flags = re.findall(r"`(--[a-z0-9-]+)", cells[0])
        defaults = cells[1].split(", ") if len(flags) > 1 else [cells[1]]
        assert len(flags) == len(defaults), f"{cells=}"
        out.update(zip(flags, defaults, strict=True))
    return out


def expected_defaults() -> dict[str, str | None]:
    """Each settings flag with its default as a table writes it; None: an upstream value flag
    whose row names a choice, not a default."""
    from sglang_overlap import settings

    out: dict[str, str | None] = {}
    for f in dataclasses.fields(settings.OverlapSettings):
        shown = "off" if f.default is False else str(f.default)
        upstream_choice = f.metadata["upstream"] and isinstance(f.default, str)
        out[settings.flag_name(f.name)] = None if upstream_choice else shown
    return out


def test_the_readme_is_a_user_guide_within_its_budget() -> None:
    size = README_PATH.stat().st_size
    assert size <= BUDGET, f"README.md is {size} bytes, budget {BUDGET}: move material to docs/"
    assert re.findall(r"^## (.+)$", README, re.M) == SECTIONS


def test_the_first_lines_say_what_is_proven_where() -> None:
    status = _words(README.split("\n\n")[1])
    assert status.startswith("**Status:") and "CPU" in status and "H100/H200" in status
    # where it says auto gating served on a GPU, the results file's auto server has its decode
    # decisions equal to the graphs that replayed
    assert "served SBO and auto gating" in status
    serve = (REPO / "benchmarks/results/h100_serve.md").read_text()
    (auto,) = [line for line in serve.splitlines() if line.startswith("| auto |")]
    assert "**equal**" in auto and "--overlap-gating auto" in auto, auto
    assert "prediction" in status


def test_the_two_commands_for_a_fresh_machine_come_first() -> None:
    """Install and serve in one line, the tests in the other, before any section; the serve
    flags are the quick start's, the extras the command installs exist."""
    first = _first_screen()
    serve_line, test_line = (line for line in re.sub(r"\\\n\s+", " ", first).splitlines()
                             if line.startswith("    "))
    install, serve = (shlex.split(part) for part in serve_line.split("&&"))
    assert install[:2] == ["pip", "install"] and install[2].endswith(".whl[sglang]")
    (quick_serve,) = _commands(_section("Quick start"), "sglang serve")
    assert serve == quick_serve
    venv, dev_install, unit, e2e = (shlex.split(part) for part in test_line.split("&&"))
    assert venv == ["python3", "-m", "venv", ".venv"]
    assert dev_install == [".venv/bin/pip", "install", "-e", ".[sglang,test]"]
    # the unit tests on two workers, then the servers one at a time: together every test
    assert unit == [".venv/bin/python", "-m", "pytest", "-q", "-n", "2", "-m", "not e2e"]
    assert e2e == [".venv/bin/python", "-m", "pytest", "-q", "-m", "e2e"]
    # CI runs the same two (adding --durations)
    ci = [shlex.split(line) for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.startswith(".venv/bin/python -m pytest")]
    assert [cmd[:len(want)] for cmd, want in zip(ci, (unit, e2e), strict=True)] == [unit, e2e]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert {"sglang", "test"} <= set(extras)


def test_the_developer_docs_are_linked_from_the_first_screen() -> None:
    linked = set(LINK.findall(_first_screen()))
    assert set(DEVELOPER_DOCS) <= linked, f"not linked: {set(DEVELOPER_DOCS) - linked}"


def test_every_local_link_resolves() -> None:
    links = [t.split("#")[0] for t in LINK.findall(README) if not t.startswith(("http", "#"))]
    assert len(links) > 8  # the pattern still finds the README's links
    missing = [t for t in links if not (REPO / t).is_file()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_install_comes_first_and_starts_from_pip_install() -> None:
    assert README.index("## Install") < README.index("## Quick start")
    install = _section("Install")
    assert _commands(install, "pip install")[0][:2] == ["pip", "install"]
    assert "sglang is an extra, not a dependency" in _words(install)
    assert "sglang-overlap --version" in install


def test_quick_start_check_and_serve_use_the_same_flags() -> None:
    quick = _section("Quick start")
    (check,), (serve,) = _commands(quick, "sglang-overlap check"), _commands(quick, "sglang serve")
    assert check[2:] == serve[2:] and "--overlap-gating" in serve


def test_the_engine_example_sets_the_variable_before_engine() -> None:
    quick = _section("Quick start")
    code = quick[quick.index("```python"):]
    assert code.index('os.environ["SGLANG_OVERLAP_ARGS"]') < code.index("sgl.Engine(")
    compile(code.split("```python", 1)[1].split("```", 1)[0], "README", "exec")


def test_the_flags_table_names_every_flag_with_its_default() -> None:
    table = table_defaults(_section("Flags"))
    for flag, default in expected_defaults().items():
        assert flag in table, f"README's Flags table lacks {flag}"
        if default is not None:
            assert table[flag] == default, f"{flag=} README={table[flag]!r} settings={default!r}"


def test_the_one_gpu_row_matches_its_results_file() -> None:
    """Every version or value the one-GPU row names is in the results file it cites (the staged
    stack, the measured ratios), and where it says servers served, that file's table has the
    baseline's measured row."""
    (row,) = [line for line in _section("What is proven where").splitlines()
              if line.startswith("| one H100")]
    source = (REPO / "benchmarks/results/h100_serve.md").read_text()
    assert "`benchmarks/results/h100_serve.md`" in row
    numbers = re.findall(r"\d+\.\d+(?:\.\w+)*", row)
    assert {"2.14.1", "2.30.7", "0.5.23"} <= set(numbers), f"{numbers=}"
    assert not [n for n in numbers if n not in source], f"{numbers=}"
    if "served" in row:
        assert re.search(r"^\| base \(no plugin\) \| - \| baseline \| \d+\.\d+ \|", source, re.M)
        for flag in re.findall(r"--[a-z0-9-]+", row):
            assert flag in source, flag


def test_the_one_gpu_flags_are_the_serve_runs() -> None:
    """The one-GPU flags and variable the README gives are the ones `run_gpu.sh serve` passes,
    and the refusal it quotes is the settings' message."""
    from sglang_overlap import settings

    item = _words(next(i for i in _section("Troubleshooting").split("\n- ")
                       if i.startswith("**One GPU")))
    suite = (REPO / "benchmarks/serve/serve_suite.py").read_text()
    assert "\nTOKENS = 256\n" in suite
    suite = re.sub(r'os\.environ\.get\("\w+", ("[^"]*")\)', r"\1",
                   suite.replace("str(TOKENS)", '"256"'))
    (flags,) = re.findall(r"`(--moe-a2a-backend [^`]+)`", item)
    pairs = list(zip(*[iter(flags.split())] * 2, strict=True))
    assert len(pairs) == 6, f"{flags=}"
    for flag, value in pairs:
        assert f'"{flag}", "{value}"' in suite, f"serve_suite.py does not pass {flag} {value}"
    (env,) = re.findall(r"`(SGLANG_DEEPEP_\w+)=(\d+)`", item)
    assert f'"{env[0]}": "{env[1]}"' in suite, f"{env=}"
    quoted = re.search(r"`\.\.\. (needs the experts[^`]+)`", item)
    tbo, one_rank = (settings.OverlapSettings(enable_two_batch_overlap=True),
                     settings.ServerFacts(moe_a2a_backend="deepep", tp_size=1))
    with pytest.raises(settings.SettingsError) as refused:
        settings.validate_settings(tbo, one_rank)
    assert quoted and quoted.group(1) in str(refused.value), f"{quoted=}"


def test_no_pointer_to_a_setting_only_the_benchmarks_read() -> None:
    assert "SGLANG_OVERLAP_SBO_WATCHDOG_S" not in README
