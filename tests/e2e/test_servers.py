"""servers.py's start-up helpers on stand-in processes (`sleep`, no SGLang): a started server
runs before it is waited for, one_after_another loads the next servers while the caller uses one
and stops each once passed, and every one on an early exit; a server stopped in the background
is gone once joined; cpu_seconds counts the group's CPU."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from servers import Lineup, Server, one_after_another, selected_params


class Sleeper(Server):
    """A Server whose process is `sleep 60`, healthy once started."""

    def __init__(self, name: str, log_dir: Path) -> None:
        super().__init__(name, Path("unused"), 0, [], {}, log_dir)
        self.argv = ["sleep", "60"]

    def _healthy(self) -> bool:
        return self.proc is not None

    def running(self) -> bool:
        """Started, and not yet told to stop."""
        return self.proc is not None and not self.stopping and self.proc.poll() is None

    def gone(self) -> bool:
        return self.proc is None or self.proc.poll() is not None


def test_wait_ready_needs_a_started_server(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="server a: wait_ready before start"):
        Sleeper("a", tmp_path).wait_ready()


@pytest.mark.parametrize("ahead", [1, 2])
def test_the_next_servers_load_while_one_is_used(tmp_path: Path, ahead: int) -> None:
    servers = [Sleeper(name, tmp_path) for name in "abcd"]
    seen = []
    for i, server in enumerate(one_after_another(servers, ahead)):
        seen.append(server.name)
        assert [s.running() for s in servers] == [
            i <= j <= i + ahead for j in range(len(servers))], (i, server.name)
    assert seen == list("abcd")
    assert all(s.gone() for s in servers)


def test_take_planned_starts_the_next_server_in_the_plan(tmp_path: Path) -> None:
    a, b, c, lone = (Sleeper(name, tmp_path) for name in ("a", "b", "c", "lone"))
    lineup = Lineup()
    try:
        assert lineup.take_planned(b, [a, b, c]) is b
        assert b.running() and c.running() and a.proc is None  # after b only, one ahead
        lineup.done(b)
        assert lineup.take_planned(Sleeper("c", tmp_path), [a, b, c]) is c  # by name: c itself
        assert a.proc is None  # nothing after c
        assert lineup.take_planned(lone, [a, b, c]) is lone and a.proc is None  # not planned
    finally:
        lineup.close()
    assert all(s.gone() for s in (a, b, c, lone))


def test_selected_params_reads_only_the_matching_items() -> None:
    mod, other = object(), object()
    def item(params: dict[str, str], fixtures: list[str], module: object) -> SimpleNamespace:
        return SimpleNamespace(callspec=SimpleNamespace(params=params), fixturenames=fixtures,
                               module=module)
    items = [item({"name": "x"}, ["graph_runs"], mod), item({"name": "y"}, ["other"], mod),
             item({"name": "z"}, ["graph_runs"], other),
             SimpleNamespace(fixturenames=["graph_runs"])]  # not parametrized
    assert selected_params(items, "name", fixture="graph_runs") == {"x", "z"}
    assert selected_params(items, "name", module=mod) == {"x", "y"}
    assert selected_params(items, "name", fixture="graph_runs", module=other) == {"z"}


def test_an_early_exit_stops_every_started_server(tmp_path: Path) -> None:
    servers = [Sleeper(name, tmp_path) for name in "abc"]
    used = one_after_another(servers)
    assert next(used).name == "a" and servers[1].running() and servers[2].proc is None
    used.close()
    assert all(s.gone() for s in servers)


def test_a_server_stopped_in_the_background_is_gone_once_joined(tmp_path: Path) -> None:
    server = Sleeper("a", tmp_path).start()
    server.stop_in_background()
    assert server.stopping and not server.running()
    server.__exit__(None, None, None)
    assert server.gone()
    server.stop_in_background()  # already gone: nothing to send
    server.__exit__(None, None, None)


def test_cpu_seconds_counts_the_process_group(tmp_path: Path) -> None:
    server = Sleeper("busy", tmp_path)
    server.argv = ["sh", "-c", "sh -c 'while :; do :; done' & sleep 60"]  # a busy child
    with server:
        deadline = time.monotonic() + 30  # the child gets its share of a loaded machine
        while server.cpu_seconds() < 0.2:
            assert time.monotonic() < deadline, server.cpu_seconds()
            time.sleep(0.2)
    assert server.cpu_seconds() == 0.0  # stopped
