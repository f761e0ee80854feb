"""benchmarks/junit_counts.py against reports pytest itself wrote for a small planted suite."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from benchmarks import junit_counts

SUITE = {
    "test_a.py": "import pytest\n"
                 "def test_ok(): pass\n"
                 "def test_ok2(): pass\n"
                 "def test_bad(): assert 1 == 2\n"
                 "@pytest.mark.skip(reason='x')\ndef test_skipped(): pass\n",
    "test_b.py": "import pytest\n"
                 "@pytest.fixture\ndef broken(): raise RuntimeError('setup')\n"
                 "def test_error(broken): pass\n"
                 "class TestC:\n    def test_in_class(self): pass\n",
    "test_c.py": "def test_only(): pass\n",
}


def _report(tmp_path: Path, name: str, files: list[str]) -> Path:
    suite = tmp_path / "suite"
    suite.mkdir(exist_ok=True)
    for f in files:
        (suite / f).write_text(SUITE[f])
    xml = tmp_path / f"junit_{name}.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={xml}", *files], cwd=suite, capture_output=True, check=False)
    return xml


def test_counts_per_file_from_pytests_own_report(tmp_path: Path) -> None:
    xml = _report(tmp_path, "mixed", ["test_a.py", "test_b.py"])
    per = junit_counts.counts(xml)
    assert set(per) == {"test_a.py", "test_b.py"}, per
    assert dict(per["test_a.py"]) == {"passed": 2, "failed": 1, "skipped": 1}
    assert dict(per["test_b.py"]) == {"errors": 1, "passed": 1}
    text, ok = junit_counts.table([xml])
    assert not ok
    assert "| mixed | test_a.py | 2 | 1 | 0 | 1 |" in text, text
    assert "| mixed | test_b.py | 1 | 0 | 1 | 0 |" in text, text
    assert text.splitlines()[-1] == "| all | | 3 | 1 | 1 | 1 |", text


def test_all_green_and_an_empty_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    green = _report(tmp_path, "green", ["test_c.py"])
    assert junit_counts.main([str(green)]) == 0
    assert "| green | test_c.py | 1 | 0 | 0 | 0 |" in capsys.readouterr().out
    empty = tmp_path / "junit_empty.xml"
    empty.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="0"/>'
                     "</testsuites>")
    assert junit_counts.main([str(green), str(empty)]) == 1  # a run with no test is a failure
    assert "| empty | (no test ran) |" in capsys.readouterr().out


@pytest.mark.parametrize(("classname", "want"), [
    ("tests.gpu.test_x", "tests/gpu/test_x.py"), ("tests.gpu.test_x.TestY", "tests/gpu/test_x.py"),
    ("", "?")])
def test_case_file_from_classname(classname: str, want: str) -> None:
    assert junit_counts.case_file(ET.Element("testcase", classname=classname)) == want


def test_an_error_alone_fails_the_table(tmp_path: Path) -> None:
    xml = _report(tmp_path, "errs", ["test_b.py"])
    text, ok = junit_counts.table([xml])
    assert not ok, text
    assert "| errs | test_b.py | 1 | 0 | 1 | 0 |" in text, text
