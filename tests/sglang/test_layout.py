"""`sglang/upstream/` holds exactly the hook files, each named after the one upstream module it
hooks; the plugin's services (the rest of `sglang/`) hook nothing. Read from the specs, not the
file names alone, so a hook added to the wrong file fails here."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

from sglang_overlap.sglang import hooks

UPSTREAM = Path(hooks.__file__).parent / "upstream"
SERVICES = Path(hooks.__file__).parent


def _targets(module: object) -> list[str]:
    return [s.target for s in getattr(module, "HOOKS", ())] + [
        s.step_target for s in getattr(module, "RESOLUTION_HOOKS", ())]


def test_the_hook_files_are_the_registered_ones() -> None:
    files = sorted(p.stem for p in UPSTREAM.glob("*.py") if p.stem != "__init__")
    assert files == sorted(hooks.GLUE_MODULES)


def owner_module(target: str) -> str:
    """The module a hook target lives in: its longest dotted prefix that is an importable module
    (`a.b.mod.Class.method` -> `a.b.mod`)."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except (ImportError, AttributeError, ValueError):
            continue
    raise AssertionError(f"no module in {target!r}")


@pytest.mark.parametrize("name", hooks.GLUE_MODULES)
def test_a_hook_file_is_named_after_the_module_it_hooks(name: str) -> None:
    pytest.importorskip("sglang.srt.server_args")
    module = importlib.import_module(f"sglang_overlap.sglang.upstream.{name}")
    owners = {owner_module(t) for t in _targets(module)}
    assert owners, f"upstream/{name}.py hooks nothing"
    for owner in owners:
        assert owner.replace(".", "_").endswith("_" + name), (name, owner)


@pytest.mark.parametrize("path", sorted(p.name for p in SERVICES.glob("*.py")))
def test_a_service_hooks_nothing(path: str) -> None:
    module = importlib.import_module(f"sglang_overlap.sglang.{Path(path).stem}")
    assert not _targets(module), f"sglang/{path} registers hooks: move them to upstream/"


def test_owner_module() -> None:
    pytest.importorskip("sglang.srt.server_args")
    assert owner_module("sglang.srt.layers.moe.utils.initialize_moe_config") == \
        "sglang.srt.layers.moe.utils"
    assert owner_module("sglang.srt.model_executor.model_runner.ModelRunner.forward") == \
        "sglang.srt.model_executor.model_runner"
