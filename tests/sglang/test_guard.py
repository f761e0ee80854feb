"""The version guard against the real sglang 0.5.23: pins match; a faked version, an altered or a
removed target is named; register() then leaves the plugin inert and overlap flags are refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("sglang.srt.server_args", reason="sglang 0.5.23 is not installed")

from sglang_overlap.sglang import guard, hooks  # noqa: E402

MODEL = ["--model-path", "/nonexistent/tiny-dsv3"]


def test_every_pin_matches_the_installed_sglang() -> None:
    """Fails CI when upstream changes a function the plugin hooks (or copies)."""
    pins = hooks.all_pins()
    assert len(pins) == len({t for t, _ in pins}) >= 17
    now = guard.current_fingerprints(t for t, _ in pins)
    assert {t: fp for t, fp in pins} == now
    assert guard.check(pins).ok


def test_an_unsupported_version_is_named() -> None:
    result = guard.check(hooks.all_pins(), version="0.5.24")
    assert not result.ok
    msg = result.message()
    assert "supports sglang 0.5.23" in msg and "sglang 0.5.24" in msg, msg


def test_an_altered_target_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.batch_overlap import single_batch_overlap as upstream

    def compute_overlap_args(dispatch_output, alt_stream):  # noqa: ANN001, ANN202
        return None, None, {}  # same name and signature, other code

    monkeypatch.setattr(upstream, "compute_overlap_args", compute_overlap_args)
    result = guard.check(hooks.all_pins())
    assert not result.ok
    assert "sglang.srt.batch_overlap.single_batch_overlap.compute_overlap_args changed" in (
        result.message()), result.message()


def test_a_removed_target_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.layers.moe import utils as upstream

    monkeypatch.delattr(upstream, "initialize_moe_config")
    result = guard.check(hooks.all_pins())
    assert result.mismatch == ("hook target sglang.srt.layers.moe.utils.initialize_moe_config "
                               "does not exist")


def test_formatting_and_decorators_do_not_count() -> None:
    import ast

    a = ast.parse("def f(x):\n    return x + 1  # why\n").body[0]
    b = ast.parse("@cache\ndef f(x):\n\n    return (x + 1)\n").body[0]
    c = ast.parse("def f(x):\n    return x + 2\n").body[0]
    assert guard._digest(a) == guard._digest(b) != guard._digest(c)


_DRIFT = """
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from sglang_overlap.sglang import guard
{patch}
from sglang_overlap.settings import SettingsError
from sglang_overlap.sglang import hooks
from sglang_overlap.sglang.server_args import parse_server_args
try:
    server_args, settings = parse_server_args({argv!r})
except SettingsError as exc:
    print("REFUSED", exc)
    raise SystemExit(0)
print("SERVED", settings.any_overlap, sorted(t for t, _ in hooks._installed))
"""


def _run(patch: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    code = _DRIFT.format(patch=patch, argv=[*MODEL, *argv])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


FAKE_VERSION = "guard.installed_version = lambda: '0.5.99'"
ALTERED = ("import sglang.srt.layers.moe.utils as u\n"
           "def initialize_moe_config(*a, **k):\n    return None\n"
           "u.initialize_moe_config = initialize_moe_config")


@pytest.mark.parametrize(("patch", "named"), [
    (FAKE_VERSION, "installed: sglang 0.5.99: this version is not supported"),
    (ALTERED, "hook target sglang.srt.layers.moe.utils.initialize_moe_config changed"),
])
def test_drift_with_an_overlap_flag_refuses_to_start(patch: str, named: str) -> None:
    done = _run(patch, ["--enable-two-batch-overlap", "--moe-a2a-backend", "deepep"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "REFUSED" in done.stdout and named in done.stdout, done.stdout + done.stderr[-2000:]
    assert "supports sglang 0.5.23" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("patch", [FAKE_VERSION, ALTERED])
def test_drift_without_overlap_flags_serves_plain_sglang(patch: str) -> None:
    done = _run(patch, [])
    assert done.returncode == 0, done.stderr[-3000:]
    from sglang_overlap.sglang.server_args import ALWAYS

    assert f"SERVED False {sorted(ALWAYS)}" in done.stdout, done.stdout + done.stderr[-2000:]
    inert = [line for line in done.stderr.splitlines() if "the plugin is inert" in line]
    assert len(inert) == 1, done.stderr[-3000:]


def test_no_drift_installs_every_hook() -> None:
    done = _run("", ["--enable-two-batch-overlap", "--moe-a2a-backend", "deepep"])
    assert done.returncode == 0, done.stderr[-3000:]
    want = sorted(s.target for s in hooks.all_specs())
    assert f"SERVED True {want}" in done.stdout, done.stdout + done.stderr[-2000:]
