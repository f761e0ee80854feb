"""`sglang-overlap args` prints every flag the server accepts from the plugin."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from sglang_overlap.cli.main import main
from sglang_overlap.settings import OverlapSettings, flag_name


def test_args_lists_every_flag(capsys) -> None:
    assert main(["args"]) == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(OverlapSettings):
        assert flag_name(f.name) in out, f.name
    assert "(SGLang) Two-batch overlap" in out


def test_args_json_matches_defaults(capsys) -> None:
    assert main(["args", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["--overlap-gating"] == "always"
    assert data["--tbo-token-distribution-threshold"] == 0.48


def test_console_script_runs_without_torch_or_sglang() -> None:
    code = (
        "import sys; from sglang_overlap.cli.main import main; rc = main(['args']);"
        "assert 'torch' not in sys.modules and 'sglang' not in sys.modules, sorted(sys.modules);"
        "raise SystemExit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_upstream_flag_is_marked_and_named(capsys) -> None:
    """The description names the flags marked (SGLang), all of them (there are four)."""
    from sglang_overlap.settings import upstream_fields

    assert main(["args"]) == 0
    out = capsys.readouterr().out
    upstream = [flag_name(f.name) for f in upstream_fields()]
    assert len(upstream) == 4 and "--moe-a2a-backend" in upstream
    flat = " ".join(out.split())
    assert ", ".join(upstream) in flat
    marked = [line for line in out.splitlines() if line.strip().startswith("(SGLang) ")]
    assert len(marked) == len(upstream), marked
