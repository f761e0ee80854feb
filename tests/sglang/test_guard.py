"""The version guard against the real sglang 0.5.23: pins match; a faked version, an altered or a
removed target is named; a changed pin turns off its feature only (a CPU-only one only on CPU),
and that feature's flags are refused, on the command line and in the Engine API alike."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_module

require_module("sglang.srt.server_args")

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


def _altered(monkeypatch: pytest.MonkeyPatch, module: str, name: str) -> str:
    """Replace upstream `module.name` by a function of the same name and other code."""
    import importlib

    mod = importlib.import_module(module)

    def changed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        return None

    changed.__name__ = changed.__qualname__ = name
    monkeypatch.setattr(mod, name, changed)
    return f"{module}.{name}"


def _verdict() -> guard.FeatureVerdict:
    return guard.check_features([*hooks.all_specs(), *hooks.resolution_specs()],
                                hooks.SHARED_PINS)


def test_no_drift_serves_every_feature() -> None:
    verdict = _verdict()
    assert (verdict.off, verdict.off_on_cpu, verdict.changed_targets) == ({}, {}, frozenset())


@pytest.mark.parametrize(("module", "name", "feature"), [
    ("sglang.srt.batch_overlap.two_batch_overlap", "compute_split_seq_index", "tbo"),
    ("sglang.srt.layers.moe.utils", "initialize_moe_config", "sbo"),
    ("sglang.srt.layers.moe.ep_moe.layer", "DeepEPMoE", "torch_a2a"),
])
def test_a_changed_target_turns_off_its_feature_only(monkeypatch: pytest.MonkeyPatch, module: str,
                                                     name: str, feature: str) -> None:
    if name == "DeepEPMoE":  # a method target: alter the method, not the class
        from sglang.srt.layers.moe.ep_moe.layer import DeepEPMoE

        def run_moe_core(self, dispatch_output):  # noqa: ANN001, ANN202
            return None

        monkeypatch.setattr(DeepEPMoE, "run_moe_core", run_moe_core)
        target = f"{module}.DeepEPMoE.run_moe_core"
    else:
        target = _altered(monkeypatch, module, name)
    verdict = _verdict()
    assert set(verdict.off) == {feature}, verdict.off
    assert f"hook target {target} changed" in str(verdict.message(feature))
    assert verdict.changed_targets == {target}


def test_a_changed_dependency_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """dp_attn reads column 5 of tp0_info_cpu: the gathered row's builder is pinned."""
    from sglang.srt.managers.scheduler_components.dp_attn import MLPSyncBatchInfo

    def _get_local_tensor(self, device, dtype=None):  # noqa: ANN001, ANN202
        return None

    monkeypatch.setattr(MLPSyncBatchInfo, "_get_local_tensor", _get_local_tensor)
    verdict = _verdict()
    assert set(verdict.off) == {"gate"}
    assert "MLPSyncBatchInfo._get_local_tensor changed" in str(verdict.message("gate"))
    assert verdict.changed_targets == frozenset()  # the hooked function itself is unchanged


def test_a_changed_shared_pin_turns_everything_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.runtime_context import RuntimeContext

    monkeypatch.setattr(RuntimeContext, "server_args", property(lambda self: None))
    verdict = _verdict()
    assert set(verdict.off) == set(hooks.FEATURES)
    assert "RuntimeContext.server_args changed" in str(verdict.message("sbo"))


@pytest.mark.parametrize("name", ["pad_inputs_to_size", "prefill_strategy"])
def test_a_changed_cpu_only_target_is_off_on_cpu_only(monkeypatch: pytest.MonkeyPatch,
                                                      name: str) -> None:
    spec = next(s for s in hooks.all_specs() if s.cpu_only and s.fn.__name__ == name)
    module, _, attr = spec.target.rpartition(".")
    if module.rpartition(".")[2][:1].isupper():  # a method: Class.method
        import importlib

        mod_name, _, cls_name = module.rpartition(".")
        cls = getattr(importlib.import_module(mod_name), cls_name)

        def changed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            return None

        changed.__name__ = changed.__qualname__ = attr
        monkeypatch.setattr(cls, attr, changed)
    else:
        _altered(monkeypatch, module, attr)
    verdict = _verdict()
    assert verdict.off == {} and set(verdict.off_on_cpu) == {spec.feature}
    assert verdict.message(spec.feature, cpu=False) is None  # a GPU server keeps it
    assert spec.target in str(verdict.message(spec.feature, cpu=True))


_DRIFT = """
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from sglang_overlap.sglang import guard
{patch}
from sglang_overlap.settings import SettingsError
from sglang_overlap.sglang import hooks
from sglang_overlap.sglang.upstream.server_args import parse_server_args
try:
    server_args, settings = parse_server_args({argv!r})
except SettingsError as exc:
    print("REFUSED", exc)
    cli = str(exc)
else:
    print("SERVED", settings.any_overlap, sorted(t for t, _ in hooks._installed))
    cli = None
if {engine!r}:
    import os
    from sglang.srt.entrypoints.engine import Engine
    os.environ.update({engine!r})
    try:
        Engine(model_path="/nonexistent/tiny-dsv3")
    except SettingsError as exc:
        print("ENGINE REFUSED", exc)
        print("SAME AS CLI", str(exc) == cli)
"""


def _run(patch: str, argv: list[str],
         engine: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = _DRIFT.format(patch=patch, argv=[*MODEL, *argv], engine=engine or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


FAKE_VERSION = "guard.installed_version = lambda: '0.5.99'"
ALTERED_SBO = ("import sglang.srt.layers.moe.utils as u\n"
               "def initialize_moe_config(*a, **k):\n    return None\n"
               "u.initialize_moe_config = initialize_moe_config")
ALTERED_CPU = ("import sglang.srt.batch_overlap.operations_strategy as o\n"
               "import sglang.srt.model_executor.forward_batch_info as f\n"
               "def _compute_moe_deepseek_blog_prefill(*a, **k):\n    return None\n"
               "def _pad_inputs_to_size(*a, **k):\n    return None\n"
               "o._compute_moe_deepseek_blog_prefill = _compute_moe_deepseek_blog_prefill\n"
               "f.ForwardBatch._pad_inputs_to_size = _pad_inputs_to_size")
TBO = ["--enable-two-batch-overlap", "--moe-a2a-backend", "deepep", "--tp", "2"]
SBO = ["--enable-single-batch-overlap", "--moe-a2a-backend", "deepep"]


@pytest.mark.parametrize(("patch", "argv", "named"), [
    (FAKE_VERSION, TBO, "installed: sglang 0.5.99: this version is not supported"),
    (ALTERED_SBO, SBO, "hook target sglang.srt.layers.moe.utils.initialize_moe_config changed"),
])
def test_drift_with_its_feature_flag_refuses_to_start(patch: str, argv: list[str],
                                                      named: str) -> None:
    done = _run(patch, argv)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "REFUSED" in done.stdout and named in done.stdout, done.stdout + done.stderr[-2000:]
    assert "supports sglang 0.5.23" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_drift_of_another_feature_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed SBO target: TBO is still served, with every hook but SBO's."""
    done = _run(ALTERED_SBO, TBO)
    assert done.returncode == 0, done.stderr[-3000:]
    want = sorted(s.target for s in hooks.all_specs() if s.feature != "sbo")
    assert f"SERVED True {want}" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "SBO is off" in done.stderr, done.stderr[-3000:]


def test_cpu_only_drift_keeps_sbo_and_tbo_on_a_gpu_server() -> None:
    done = _run(ALTERED_CPU, ["--device", "cuda", "--enable-two-batch-overlap",
                              "--enable-single-batch-overlap", "--moe-a2a-backend", "deepep",
                              "--tp", "2"])
    assert "SERVED True" in done.stdout, done.stdout + done.stderr[-3000:]
    done = _run(ALTERED_CPU, ["--device", "cpu", *TBO])
    assert "REFUSED" in done.stdout and "_compute_moe_deepseek_blog_prefill changed" in (
        done.stdout), done.stdout + done.stderr[-3000:]


def test_drift_without_overlap_flags_serves_plain_sglang() -> None:
    done = _run(FAKE_VERSION, [])
    assert done.returncode == 0, done.stderr[-3000:]
    from sglang_overlap.sglang.upstream.server_args import ALWAYS

    assert f"SERVED False {sorted(ALWAYS)}" in done.stdout, done.stdout + done.stderr[-2000:]
    inert = [line for line in done.stderr.splitlines() if "the plugin is inert" in line]
    assert len(inert) == 1, done.stderr[-3000:]


@pytest.mark.parametrize("engine", [
    {"SGLANG_OVERLAP_ARGS": "--enable-two-batch-overlap --moe-a2a-backend deepep"},
])
def test_the_engine_api_is_refused_like_the_command_line(engine: dict[str, str]) -> None:
    done = _run(FAKE_VERSION, TBO[:3], engine)  # the Engine's --tp is SGLang's default, 1
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ENGINE REFUSED" in done.stdout and "SAME AS CLI True" in done.stdout, (
        done.stdout + done.stderr[-3000:])


def test_no_drift_installs_every_hook() -> None:
    done = _run("", TBO)
    assert done.returncode == 0, done.stderr[-3000:]
    want = sorted(s.target for s in hooks.all_specs())
    assert f"SERVED True {want}" in done.stdout, done.stdout + done.stderr[-2000:]


def test_the_digest_ignores_fields_a_python_version_leaves_empty() -> None:
    # 3.12 adds `type_params=[]` to every definition and 3.13's ast.dump drops empty fields: an
    # empty or absent field must not change a pin
    full = ast.Call(func=ast.Name(id="f", ctx=ast.Load()), args=[], keywords=[])
    bare = ast.Call(func=ast.Name(id="f", ctx=ast.Load()))
    assert guard._canonical(full) == guard._canonical(bare) == "Call(func=Name(id='f', ctx=Load()))"
    with_arg = ast.Call(func=ast.Name(id="f", ctx=ast.Load()), args=[ast.Constant(0)], keywords=[])
    assert guard._canonical(with_arg) != guard._canonical(full)
    assert guard._canonical(ast.Constant(None)) == "Constant()"  # a None value is left out too


PIN_CHECK = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from sglang_overlap.sglang import guard, hooks
guard._sglang_dir = lambda: Path(sys.argv[2])
pins = [p for s in (*hooks.all_specs(), *hooks.resolution_specs()) for p in s.pins()]
src = guard._Sources(Path(sys.argv[2]))
for p in (*pins, *hooks.SHARED_PINS):
    print(p.target, guard.fingerprint(src, p.target) == p.fingerprint)
"""


def _other_pythons() -> list[str]:
    import glob
    import shutil

    found = {shutil.which(f"python3.{m}") for m in (12, 13)}  # pyenv's shims do not run
    found |= set(glob.glob("/root/.pyenv/versions/3.1[23].*/bin/python3"))
    return sorted(p for p in found if p and "/shims/" not in p and p != sys.executable)


@pytest.mark.skipif(not _other_pythons(), reason="no Python 3.12/3.13 on this machine")
def test_every_pin_reads_the_same_on_python_312_and_313() -> None:
    """The pins hold for sglang 0.5.23 read by another Python: on 3.12 the old ast.dump digest
    turned the whole plugin off (seen on the GPU machine's Python 3.12)."""
    import subprocess

    root = guard._sglang_dir()
    assert root is not None
    repo = str(Path(guard.__file__).resolve().parents[2])
    for python in _other_pythons():
        out = subprocess.run([python, "-c", PIN_CHECK, repo, str(root)], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        rows = [line.rsplit(" ", 1) for line in out.stdout.splitlines()]
        assert len(rows) >= 30 and all(ok == "True" for _, ok in rows), (python, rows)
