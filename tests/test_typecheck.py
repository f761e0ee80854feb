"""The type check CI runs on the code it cannot run (pyproject's [tool.mypy], .ci/run's lint
step): it covers the GPU tests, the benchmarks and the kernels, reads function bodies, and a
renamed helper left behind by a GPU caller fails it (the rename that happened: the fp8 inverses
moved from sglang_overlap.kernels.fp8 to tests/oracle/fp8.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_configuration_covers_what_ci_cannot_run() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert set(config["files"]) >= {"sglang_overlap", "tests/gpu", "benchmarks"}, config
    assert config["check_untyped_defs"] is True
    assert "exclude" not in config, config["exclude"]  # benchmarks/serve is checked too
    ignored = {m for o in config.get("overrides", []) if o.get("ignore_errors")
               for m in ([o["module"]] if isinstance(o["module"], str) else o["module"])}
    assert not ignored, ignored
    lint = (ROOT / ".ci" / "run").read_text().split('step "lint"')[1].split("step ")[0]
    assert re.search(r"^\.venv/bin/mypy$", lint, re.M), lint  # the configured files, all


@pytest.mark.parametrize("helper", ["sglang_overlap.kernels", "tests.oracle"])
def test_a_gpu_caller_left_behind_by_a_rename_fails(tmp_path: Path, helper: str) -> None:
    api = pytest.importorskip("mypy.api")
    planted = tmp_path / "planted_gpu_caller.py"
    planted.write_text(f"def fp32_reference(case, valid):  # untyped, as GPU tests are\n"
                       f"    from {helper} import fp8\n\n"
                       f"    return fp8.dequant_per_token_group(case.a, case.a_s)\n")
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), str(planted)])
    if helper == "tests.oracle":
        assert status == 0, out + err
    else:
        assert status == 1 and 'Module has no attribute "dequant_per_token_group"' in out, out
