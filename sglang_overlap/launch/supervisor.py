"""Run a set of processes as one unit: all ready, or all stopped.

Each child starts in its own session (so its process group id is its pid and a terminal's
Ctrl-C reaches only the launcher), logs to its own file, and carries the environment variable
LAUNCH_ID_ENV. Stopping sends SIGTERM to each child's group, SIGKILL to what is left after a
grace period, and finally to any process that still carries this launch's id (SGLang's
scheduler processes, should one have left its group). Nothing is killed by name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sglang_overlap.launch.commands import ProcessSpec

LAUNCH_ID_ENV = "SGLANG_OVERLAP_LAUNCH_ID"


class LaunchFailed(RuntimeError):
    """A child died or never became ready; the message says which one and why."""


class Stopped(RuntimeError):
    """SIGINT or SIGTERM reached the launcher."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class Child:
    spec: ProcessSpec
    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float
    ready: bool = False


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = resp.read().decode(errors="replace")
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        return body


def is_ready(spec: ProcessSpec) -> bool:
    """One readiness probe: /health answers 200, or the router lists every worker as ready."""
    if spec.health_url is None:
        return True
    try:
        body = _get_json(spec.health_url)
    except (urllib.error.URLError, OSError, ValueError):
        return False
    if not spec.router_workers:
        return True
    workers = body.get("workers", []) if isinstance(body, dict) else []
    ready = {str(w.get("url", "")).rstrip("/") for w in workers
             if w.get("is_healthy", True) and w.get("status", "ready") == "ready"}
    return all(u.rstrip("/") in ready for u in spec.router_workers)


def pids_with_launch_id(launch_id: str) -> list[int]:
    """Live processes whose environment carries this launch's id (Linux /proc; [] elsewhere)."""
    needle = f"{LAUNCH_ID_ENV}={launch_id}".encode()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _set_parent_death_signal() -> None:
    """In the child: get SIGTERM if the launcher dies without cleaning up (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Supervisor:
    def __init__(self, log_dir: Path, launch_id: str, out: IO[str] = sys.stderr) -> None:
        self.log_dir, self.launch_id, self.out = log_dir, launch_id, out
        self.children: list[Child] = []
        self._signal: int | None = None

    def say(self, msg: str) -> None:
        print(f"[launch] {msg}", file=self.out, flush=True)

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            self._signal = signum

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def start(self, spec: ProcessSpec) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{spec.name}.log"
        env = {**os.environ, **spec.env, LAUNCH_ID_ENV: self.launch_id}
        with open(log_path, "ab") as log:
            try:
                proc = subprocess.Popen(
                    list(spec.argv), stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                    preexec_fn=_set_parent_death_signal,
                )
            except OSError as exc:  # not installed, not executable
                raise LaunchFailed(f"{spec.name}: cannot start {spec.argv[0]}: {exc}") from exc
        child = Child(spec, proc, log_path, time.monotonic())
        self.children.append(child)
        self.say(f"{spec.name}: started pid {proc.pid}, log {log_path}")
        return child

    def check(self) -> None:
        """Raise Stopped on a signal, LaunchFailed if any child has exited."""
        if self._signal is not None:
            raise Stopped(self._signal)
        for c in self.children:
            code = c.proc.poll()
            if code is not None:
                raise LaunchFailed(
                    f"{c.spec.name} (pid {c.proc.pid}) {describe_exit(code)}; last lines of "
                    f"{c.log_path}:\n{tail(c.log_path)}"
                )

    def wait_ready(self, children: Iterable[Child], timeout: float,
                   poll_s: float = 1.0, report_every_s: float = 15.0) -> None:
        pending = [c for c in children if not c.ready]
        start = last_report = time.monotonic()
        while pending:
            self.check()
            for c in list(pending):
                if is_ready(c.spec):
                    c.ready = True
                    pending.remove(c)
                    self.say(f"{c.spec.name}: ready after {time.monotonic() - c.started:.0f} s")
            now = time.monotonic()
            if pending and now - start > timeout:
                names = ", ".join(c.spec.name for c in pending)
                last = "; ".join(f"{c.spec.name}: {tail(c.log_path, 1)[:160]}" for c in pending)
                raise LaunchFailed(f"not ready after {timeout:.0f} s: {names} (last log lines: "
                                   f"{last})")
            if pending and now - last_report >= report_every_s:
                last_report = now
                for c in pending:
                    self.say(f"waiting for {c.spec.name} ({now - c.started:.0f} s): "
                             f"{tail(c.log_path, 1)[:160]}")
            time.sleep(poll_s)

    def watch(self, poll_s: float = 0.5, on_tick: Callable[[], None] | None = None) -> None:
        """Block until a signal or a child's death (raised as Stopped / LaunchFailed)."""
        while True:
            self.check()
            if on_tick is not None:
                on_tick()
            time.sleep(poll_s)

    def stop_all(self, grace_s: float = 20.0) -> None:
        """Stop every child: SIGTERM to each group, SIGKILL after `grace_s`, then the strays."""
        live = [c for c in self.children if c.proc.poll() is None]
        for c in reversed(live):
            self.say(f"stopping {c.spec.name} (pid {c.proc.pid})")
            _killpg(c.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for c in self.children:
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"{c.spec.name} did not stop within {grace_s:.0f} s: SIGKILL")
            _killpg(c.proc.pid, signal.SIGKILL)  # the group's leftovers, if any
            c.proc.wait()
        for pid in pids_with_launch_id(self.launch_id):
            self.say(f"killing leftover process {pid}")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
