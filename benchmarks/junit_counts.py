"""Per test file counts (passed / failed / errors / skipped) from pytest's JUnit XML reports.

    python benchmarks/junit_counts.py OUT/junit_*.xml      # a markdown table, one row per file

`run_gpu.sh gpusuite` writes one report per pytest run (`--junitxml`); the same file run in
two reports (the DeepEP tests once per tree) gets one row per report, labelled by the report's
name. Exit 1 when any test failed or errored, or a report holds no test.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

OUTCOMES = ("passed", "failed", "errors", "skipped")


def outcome(case: ET.Element) -> str:
    """One <testcase>'s outcome: the first of failure / error / skipped it holds, else passed."""
    for tag, name in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped")):
        if case.find(tag) is not None:
            return name
    return "passed"


def case_file(case: ET.Element) -> str:
    """The test file of a <testcase>: its `file` attribute, else its dotted classname's module
    (`tests.gpu.test_x` or `tests.gpu.test_x.TestClass` -> `tests/gpu/test_x.py`)."""
    if case.get("file"):
        return str(case.get("file"))
    parts = str(case.get("classname", "")).split(".")
    while parts and not parts[-1].startswith("test_"):
        parts.pop()
    return "/".join(parts) + ".py" if parts else "?"


def counts(report: Path) -> dict[str, Counter[str]]:
    """{test file: Counter(outcome)} of one JUnit XML report."""
    per: dict[str, Counter[str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        per.setdefault(case_file(case), Counter())[outcome(case)] += 1
    return per


def table(reports: list[Path]) -> tuple[str, bool]:
    """(markdown table, all passed): one row per (report, file), a total row last."""
    rows = ["| run | file | " + " | ".join(OUTCOMES) + " |", "|---|---|" + "---|" * len(OUTCOMES)]
    total: Counter[str] = Counter()
    ok = True
    for report in reports:
        per = counts(report)
        ok = ok and bool(per)
        run = report.stem.removeprefix("junit_")
        for file, c in sorted(per.items()):
            total.update(c)
            ok = ok and c["failed"] == 0 and c["errors"] == 0
            rows.append(f"| {run} | {file} | " + " | ".join(str(c[o]) for o in OUTCOMES) + " |")
        if not per:
            rows.append(f"| {run} | (no test ran) |" + " |" * len(OUTCOMES))
    rows.append("| all | | " + " | ".join(str(total[o]) for o in OUTCOMES) + " |")
    return "\n".join(rows), ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", type=Path, help="pytest --junitxml files")
    args = ap.parse_args(argv)
    text, ok = table(args.reports)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
