"""sglang_overlap/launch/supervisor.py with real processes (small Python children, not SGLang:
tests/e2e/test_launch_pd.py does the same with real servers)."""

from __future__ import annotations

import io
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sglang_overlap.launch.commands import ProcessSpec
from sglang_overlap.launch.supervisor import (
    LaunchFailed,
    Supervisor,
    describe_exit,
    is_ready,
    pids_with_launch_id,
)

PY = sys.executable
SLEEPER = (PY, "-c", "import time; time.sleep(120)")


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Supervisor]:
    s = Supervisor(tmp_path / "logs", f"test-{uuid.uuid4().hex}", out=io.StringIO())
    yield s
    s.stop_all(grace_s=2)
    assert pids_with_launch_id(s.launch_id) == []


def _wait_dead(s: Supervisor, timeout: float = 30) -> LaunchFailed:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            s.check()
        except LaunchFailed as exc:
            return exc
        time.sleep(0.1)
    raise AssertionError("no child died")


def test_dead_child_is_named_with_code_and_log(sup: Supervisor) -> None:
    sup.start(ProcessSpec("sleeper", SLEEPER))
    code = "import sys; print('loading'); print('boom: out of memory'); sys.exit(3)"
    sup.start(ProcessSpec("crasher", (PY, "-c", code), {"X": "1"}))
    exc = _wait_dead(sup)
    msg = str(exc)
    assert msg.startswith("crasher (pid ") and "exited with code 3" in msg, msg
    assert msg.endswith("loading\nboom: out of memory"), msg
    assert len(pids_with_launch_id(sup.launch_id)) == 1  # the sleeper
    sup.stop_all(grace_s=5)
    assert pids_with_launch_id(sup.launch_id) == []
    assert all(c.proc.returncode is not None for c in sup.children)


def test_stop_all_kills_processes_that_left_the_group(sup: Supervisor, tmp_path: Path) -> None:
    # A grandchild in its own session escapes killpg; the launch id in its environment does not.
    pidfile = tmp_path / "grandchild.pid"
    code = (f"import subprocess, time; p = subprocess.Popen({list(SLEEPER)!r}, "
            f"start_new_session=True); open({str(pidfile)!r}, 'w').write(str(p.pid)); "
            "time.sleep(120)")
    sup.start(ProcessSpec("parent", (PY, "-c", code)))
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    grandchild = int(pidfile.read_text())
    assert grandchild in pids_with_launch_id(sup.launch_id)
    sup.stop_all(grace_s=5)
    time.sleep(0.2)
    assert grandchild not in pids_with_launch_id(sup.launch_id)
    assert not Path(f"/proc/{grandchild}").exists() or "Z" in _state(grandchild)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0]
    except OSError:
        return "gone"


def test_sigterm_ignored_gets_sigkill(sup: Supervisor) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    child = sup.start(ProcessSpec("stubborn", (PY, "-c", code)))
    time.sleep(1.0)  # let it install the handler
    t0 = time.monotonic()
    sup.stop_all(grace_s=1)
    assert child.proc.returncode == -9 and time.monotonic() - t0 < 10
    assert describe_exit(-9) == "killed by SIGKILL" and describe_exit(2) == "exited with code 2"


class _Workers(BaseHTTPRequestHandler):
    body: dict[str, Any] = {}

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        data = json.dumps(self.body).encode()
        self.send_response(200 if self.path in ("/workers", "/health") else 404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_a_program_that_cannot_start_is_named(sup: Supervisor, tmp_path: Path) -> None:
    spec = ProcessSpec("router", (str(tmp_path / "no-such-smg"), "launch"))
    with pytest.raises(LaunchFailed, match=r"^router: cannot start .*no-such-smg: \[Errno 2\]"):
        sup.start(spec)
    assert sup.children == []


def test_router_ready_only_when_every_worker_is_listed_ready() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Workers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    spec = ProcessSpec("router", (), {}, f"{base}/workers", ("http://p:1", "http://d:2"))
    try:
        _Workers.body = {"workers": [{"url": "http://p:1", "status": "ready", "is_healthy": True}]}
        assert not is_ready(spec)
        _Workers.body["workers"].append({"url": "http://d:2/", "status": "pending"})
        assert not is_ready(spec)
        _Workers.body["workers"][1]["status"] = "ready"
        assert is_ready(spec)
        assert is_ready(ProcessSpec("server", (), {}, f"{base}/health"))
        assert not is_ready(ProcessSpec("server", (), {}, f"{base}/nope"))
    finally:
        server.shutdown()
    assert not is_ready(spec)  # nobody listening


def test_wait_ready_times_out_naming_the_laggard(sup: Supervisor) -> None:
    spec = ProcessSpec("slow", SLEEPER, {}, "http://127.0.0.1:9/health")
    child = sup.start(spec)
    with pytest.raises(LaunchFailed, match=r"not ready after 2 s: slow"):
        sup.wait_ready([child], timeout=2, poll_s=0.2)


def test_wait_ready_raises_when_a_child_dies_meanwhile(sup: Supervisor) -> None:
    waiting = sup.start(ProcessSpec("waiting", SLEEPER, {}, "http://127.0.0.1:9/health"))
    sup.start(ProcessSpec("dies", (PY, "-c", "raise SystemExit(7)")))
    with pytest.raises(LaunchFailed, match=r"dies \(pid \d+\) exited with code 7"):
        sup.wait_ready([waiting], timeout=60, poll_s=0.2)
