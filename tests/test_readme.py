"""README.md's first screen as a new user reads it: the status line, an install that starts from
`pip install`, quick-start `check` and `serve` lines with the same flags, an Engine example that
sets SGLANG_OVERLAP_ARGS before Engine(), no pointer to a setting the server does not read."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end]


def _commands(text: str, program: str) -> list[list[str]]:
    """Indented command lines (backslash continuations joined) that start with `program`."""
    joined = re.sub(r"\\\n\s+", " ", text)
    return [shlex.split(line.split("#")[0]) for line in joined.splitlines()
            if line.startswith("    " + program)]


def test_the_first_lines_say_what_is_proven_where() -> None:
    status = README.split("\n\n")[1]
    assert status.startswith("**Status:") and "CPU" in status and "H100/H200" in status
    assert "has not\nrun it yet" in status or "has not run it yet" in " ".join(status.split())
    assert "prediction" in status


def test_install_comes_first_and_starts_from_pip_install() -> None:
    assert README.index("## Install") < README.index("## Quick start")
    install = _section("Install")
    assert _commands(install, "pip install")[0][:2] == ["pip", "install"]
    assert "sglang is an extra, not a dependency" in install
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


def test_no_pointer_to_a_setting_only_the_benchmarks_read() -> None:
    assert "SGLANG_OVERLAP_SBO_WATCHDOG_S" not in README
