"""The package's layers import downward only, and no module-level import cycle exists.

Read from the source (every import statement, those inside functions too), so a lazy import that
breaks a rule is caught as well:

- modes.py: the vocabulary (modes, phases, the step's decision): imports nothing of the package,
  and every layer may import it;
- planning/: pure Python, imports nothing of the package but planning/ and modes (no torch, no
  sglang);
- kernels/ (what the server runs): never the glue, the commands or sglang;
- compat.py (the compatibility table): below kernels/ (they read its pins), so it never imports
  them: the release tables both read are data in planning/;
- sglang/ (the glue): the only importer of sglang;
- nothing in the package imports `tests` or `benchmarks` (what only they run: the oracle
  `tests/oracle/`, the GPU harness `benchmarks/harness/`);
- the oracle and the harness: never sglang or the glue; the oracle shares no code with what it
  checks (`kernels.layouts`, the dispatchers);
- no import cycle among the package's modules, not even through an import inside a function
  (the arrow between two modules goes one way: `cli.check` renders with `cli.check_text`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = (ROOT / "sglang_overlap", ROOT / "tests" / "oracle", ROOT / "benchmarks" / "harness")
HEAVY = {"torch", "triton", "numpy", "sglang", "deep_ep", "deep_gemm"}
GLUE = {"sglang", "cli", "launch", "evals", "plugin"}
# layer -> the package's parts it must not import
FORBIDDEN = {
    "kernels": GLUE,
    "compat": GLUE | {"kernels"},
    "oracle": GLUE | {"kernels.layouts", "kernels.a2a", "kernels.experts"},
    "harness": GLUE,
}
NOT_SERVED = {"tests", "benchmarks"}


def _modules() -> dict[str, Path]:
    out = {}
    for tree in TREES:
        for path in sorted(tree.rglob("*.py")):
            if path.name.startswith("test_"):
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _imports(path: Path, *, top_level_only: bool) -> list[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out: list[str] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _violations(module: str, imported: list[str]) -> list[str]:
    layer, served, bad = _layer(module), module.startswith("sglang_overlap"), []
    for name in imported:
        top = name.split(".")[0]
        if top == "sglang" and not (served and layer == "sglang"):
            bad.append(f"{module} imports {name}: only sglang_overlap.sglang imports sglang")
        if served and top in NOT_SERVED:
            bad.append(f"{module} imports {name}: the package never imports {top}/")
        if layer in ("planning", "modes") and top in HEAVY:
            bad.append(f"{module} imports {name}: planning/ is pure Python")
        if top != "sglang_overlap" or "." not in name:
            continue
        target = name.split(".")[1]
        if layer == "planning" and target not in ("planning", "modes"):
            bad.append(f"{module} imports {name}: planning/ imports only planning/ and modes")
        if layer == "modes":
            bad.append(f"{module} imports {name}: modes.py imports nothing of the package")
        inner = name.partition(".")[2]  # "kernels.layouts.pack"
        for part in sorted(FORBIDDEN.get(layer, set())):
            if inner == part or inner.startswith(part + "."):
                bad.append(f"{module} imports {name}: {layer} must not import {part}")
    return bad


def test_the_scan_sees_the_package() -> None:
    for name in ("sglang_overlap.planning.selector", "sglang_overlap.kernels.down_gemm",
                 "tests.oracle.executors", "sglang_overlap.sglang.hooks"):
        assert name in MODULES
    assert "torch" in _imports(MODULES["sglang_overlap.kernels.down_gemm"], top_level_only=True)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_layers_import_downward_only(module: str) -> None:
    assert _violations(module, _imports(MODULES[module], top_level_only=False)) == []


@pytest.mark.parametrize(("module", "imported"), [
    ("sglang_overlap.planning.selector", ["torch"]),
    ("sglang_overlap.planning.selector", ["sglang_overlap.kernels.fp8"]),
    ("sglang_overlap.planning.selector", ["sglang_overlap.settings"]),
    ("sglang_overlap.modes", ["sglang_overlap.planning.step_table"]),
    ("sglang_overlap.modes", ["torch"]),
    ("sglang_overlap.kernels.down_gemm", ["sglang_overlap.sglang.state"]),
    ("sglang_overlap.kernels.down_gemm", ["tests.oracle.experts"]),
    ("sglang_overlap.sglang.sbo_decision", ["tests.oracle.router"]),
    ("sglang_overlap.kernels.down_gemm", ["benchmarks.harness.sbo_watchdog"]),
    ("tests.oracle.experts", ["sglang_overlap.kernels.layouts"]),
    ("tests.oracle.experts", ["sglang_overlap.sglang.state"]),
    ("benchmarks.harness.sbo_layer", ["sglang.srt.utils"]),
    ("sglang_overlap.cli.check", ["sglang.srt.plugins"]),
    ("sglang_overlap.compat", ["sglang_overlap.kernels.signal_deepgemm.versions"]),
    ("sglang_overlap.compat", ["sglang_overlap.kernels.triton_versions.oldest_building"]),
    ("sglang_overlap.compat", ["sglang_overlap.cli.check"]),
])
def test_a_broken_rule_is_caught(module: str, imported: list[str]) -> None:
    assert _violations(module, imported)


def _package_graph(*, top_level_only: bool = True,
                   prefix: str = "") -> dict[str, set[str]]:
    """module -> the modules it imports (of those whose names start with `prefix`)."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        if not module.startswith(prefix):
            continue
        deps = set()
        for name in _imports(path, top_level_only=top_level_only):
            while name and name not in MODULES:  # `from a.b import c`: c may be a name in a.b
                name = name.rpartition(".")[0]
            if name.startswith(prefix) and name != module and not module.startswith(name + "."):
                deps.add(name)  # a package's own __init__ is imported first anyway
        graph[module] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_level_import_cycle() -> None:
    assert _cycle(_package_graph()) is None


def test_no_import_cycle_in_the_package_even_through_lazy_imports() -> None:
    """An import inside a function still ties two modules together: one of them must be the
    lower home of what both use."""
    graph = _package_graph(top_level_only=False, prefix="sglang_overlap")
    assert "sglang_overlap.cli.check_text" in graph["sglang_overlap.cli.check"]
    assert _cycle(graph) is None


def test_a_lazy_cycle_is_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """check_text importing check back, inside a function, is a cycle."""
    text = tmp_path / "check_text.py"
    text.write_text("def render():\n    from sglang_overlap.cli.check import gather\n")
    monkeypatch.setitem(MODULES, "sglang_overlap.cli.check_text", text)
    assert _cycle(_package_graph(top_level_only=False, prefix="sglang_overlap")) is not None
    assert _cycle(_package_graph(prefix="sglang_overlap")) is None  # not at module level


def test_a_cycle_is_found() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
