"""Tests for `sglang-overlap gate` (cli/gate.py): the learned table as printed. The endpoint it
reads is exercised against real servers in tests/e2e/test_gating.py."""

from __future__ import annotations

import socket

import pytest

from sglang_overlap.cli import gate
from sglang_overlap.cli.main import main

# What internal_state.served_table serves (sglang/internal_state.py), read back from /server_info.
TABLE = {"setup": "--overlap-hardware-profile auto on device 'cpu': ...", "prior": "flat (x)",
         "steps": 120, "explored": 4, "syncs": 7, "chosen": {"decode/none": 110, "decode/tbo": 4,
                                                             "prefill/none": 6},
         "rows": [{"phase": "decode", "tokens": [16, 19], "mode": "none", "count": 60,
                   "mean_ms": 69.61},
                  {"phase": "decode", "tokens": [16, 19], "mode": "tbo", "count": 2,
                   "mean_ms": 141.2},
                  {"phase": "prefill", "tokens": [1, 1], "mode": "none", "count": 4,
                   "mean_ms": 30.0}]}


def test_format_table() -> None:
    text = gate.format_table(TABLE)
    assert "120 steps, 4 explored, 7 syncs" in text
    assert "steps run per mode: decode/none=110, decode/tbo=4, prefill/none=6" in text
    line = next(x for x in text.splitlines() if x.startswith("decode "))
    assert "16-19: none=69.610ms x60, tbo=141.200ms x2  (fastest none)" in line, line
    assert any(x.startswith("prefill ") and "tokens           1:" in x for x in text.splitlines())


def test_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["gate", "--url", f"http://127.0.0.1:{port}"]) == 2
    assert "cannot read" in capsys.readouterr().err
