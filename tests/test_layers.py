"""The package's layers import downward only, and no module-level import cycle exists.

Read from the source (every import statement, those inside functions too), so a lazy import that
breaks a rule is caught as well:

- planning/: pure Python, imports nothing of the package but planning/ (no torch, no sglang);
- kernels/ (what the server runs) and reference/ (the oracle that checks it): never the glue, the
  commands or sglang; kernels/ never reference/;
- sglang/ (the glue, the only importer of sglang): never reference/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sglang_overlap"
HEAVY = {"torch", "triton", "numpy", "sglang", "deep_ep", "deep_gemm"}
# layer -> the package's top-level parts it must not import
FORBIDDEN = {
    "kernels": {"sglang", "reference", "cli", "launch", "evals", "plugin"},
    "reference": {"sglang", "cli", "launch", "evals", "plugin"},
    "sglang": {"reference"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
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
    layer, bad = _layer(module), []
    for name in imported:
        top = name.split(".")[0]
        if top == "sglang" and layer != "sglang":
            bad.append(f"{module} imports {name}: only sglang_overlap.sglang imports sglang")
        if layer == "planning" and top in HEAVY:
            bad.append(f"{module} imports {name}: planning/ is pure Python")
        if top != "sglang_overlap" or "." not in name:
            continue
        target = name.split(".")[1]
        if layer == "planning" and target != "planning":
            bad.append(f"{module} imports {name}: planning/ imports only planning/")
        if target in FORBIDDEN.get(layer, set()):
            bad.append(f"{module} imports {name}: {layer}/ must not import {target}")
    return bad


def test_the_scan_sees_the_package() -> None:
    for name in ("sglang_overlap.planning.selector", "sglang_overlap.kernels.down_gemm",
                 "sglang_overlap.reference.executors", "sglang_overlap.sglang.hooks"):
        assert name in MODULES
    assert "torch" in _imports(MODULES["sglang_overlap.kernels.down_gemm"], top_level_only=True)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_layers_import_downward_only(module: str) -> None:
    assert _violations(module, _imports(MODULES[module], top_level_only=False)) == []


@pytest.mark.parametrize(("module", "imported"), [
    ("sglang_overlap.planning.selector", ["torch"]),
    ("sglang_overlap.planning.selector", ["sglang_overlap.kernels.fp8"]),
    ("sglang_overlap.kernels.down_gemm", ["sglang_overlap.sglang.state"]),
    ("sglang_overlap.kernels.down_gemm", ["sglang_overlap.reference.experts"]),
    ("sglang_overlap.sglang.sbo_decision", ["sglang_overlap.reference.router"]),
    ("sglang_overlap.cli.check", ["sglang.srt.plugins"]),
])
def test_a_broken_rule_is_caught(module: str, imported: list[str]) -> None:
    assert _violations(module, imported)


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        deps = set()
        for name in _imports(path, top_level_only=True):
            while name and name not in MODULES:  # `from a.b import c`: c may be a name in a.b
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):
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


def test_a_cycle_is_found() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
