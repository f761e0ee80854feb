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


def test_plot_data_exact() -> None:
    from sglang_overlap.cli.gate_plot import plot_data

    rows = [*TABLE["rows"],
            {"phase": "decode", "tokens": [4, 4], "mode": "tbo", "count": 3, "mean_ms": 50.0},
            {"phase": "decode", "tokens": [4, 4], "mode": "none", "count": 9, "mean_ms": 55.5},
            {"phase": "decode", "tokens": [65536, 1 << 62], "mode": "sbo", "count": 1,
             "mean_ms": 900.0}]
    decode, prefill = plot_data({**TABLE, "rows": rows})
    assert decode.phase == "decode" and decode.buckets == ("4", "16-19", "65536-inf")
    assert decode.ms == {"none": (55.5, 69.61, None), "tbo": (50.0, 141.2, None),
                         "sbo": (None, None, 900.0)}
    assert decode.count == {"none": (9, 60, 0), "tbo": (3, 2, 0), "sbo": (0, 0, 1)}
    assert decode.chosen == ("tbo", "none", "sbo")
    assert prefill.buckets == ("1",) and prefill.ms == {"none": (30.0,)}
    assert prefill.chosen == ("none",)
    assert plot_data({**TABLE, "rows": []}) == []


@pytest.fixture()
def served_table():
    """A real HTTP server answering GET /server_info as SGLang does with the gate's entry."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's API
            body = json.dumps({"internal_states": [{"sglang_overlap_gate": TABLE}]}).encode()
            self.send_response(200 if self.path == "/server_info" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_plot_writes_a_png(served_table: str, tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "gate.png"
    assert main(["gate", "--url", served_table, "--plot", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1320, 792), (width, height)  # 12 x 7.2 in at 110 dpi
    assert 10_000 < len(data) < 1_000_000, len(data)
    assert f"plot: {out}" in capsys.readouterr().out


def test_plot_of_a_missing_dp_rank(served_table: str, tmp_path, capsys) -> None:
    assert main(["gate", "--url", served_table, "--plot", str(tmp_path / "g.png"),
                 "--dp-rank", "1"]) == 2
    assert "--dp-rank 1: the server has DP ranks 0-0" in capsys.readouterr().err
    assert not (tmp_path / "g.png").exists()
