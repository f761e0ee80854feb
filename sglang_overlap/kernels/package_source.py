"""A package's functions and version read from its Python source, without importing it.

`import deep_ep` runs host checks and loads `_C` at import time; on a machine without a usable
CUDA device it raises, and on a serving box it initialises NVSHMEM/JIT state. So these readers
locate the package with a path finder (no import), parse the file that defines the function with
`ast`, follow `from .x import y` re-exports and `alias = name` assignments, and return the
parameter list. A module that is already imported is asked through `inspect.signature` instead.
Versions come from the distribution metadata (then the package's `__version__` in source).
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.metadata
import inspect
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_DISTRIBUTIONS = {"deep_ep": ("sgl-deep-ep", "deep-ep", "deep_ep"),
                  "deep_gemm": ("sgl-deep-gemm", "deep-gemm", "deep_gemm")}


@dataclass(frozen=True)
class FunctionParams:
    """A function's parameters as declared (`self` included for methods)."""

    positional: tuple[str, ...]  # positional-or-keyword (and positional-only) names, in order
    keyword_only: tuple[str, ...]
    defaults: frozenset[str]  # names that have a default
    var_positional: bool
    var_keyword: bool
    where: str  # "path/file.py:line" (ast) or "inspect"

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.positional + self.keyword_only)

    def accepts(self, *keywords: str) -> bool:
        """True when every keyword is a declared parameter (a **kwargs catch-all does not count:
        it proves nothing about what the body does with the value)."""
        return all(k in self.names for k in keywords)

    def signature(self) -> inspect.Signature:
        """An `inspect.Signature` to `bind` call arguments against, exactly as Python would."""
        kind = inspect.Parameter
        params = [kind(n, kind.POSITIONAL_OR_KEYWORD,
                       default=None if n in self.defaults else kind.empty)
                  for n in self.positional]
        if self.var_positional:
            params.append(kind("args", kind.VAR_POSITIONAL))
        params += [kind(n, kind.KEYWORD_ONLY, default=None if n in self.defaults else kind.empty)
                   for n in self.keyword_only]
        if self.var_keyword:
            params.append(kind("kwargs", kind.VAR_KEYWORD))
        return inspect.Signature(params)


@dataclass(frozen=True)
class PackageProbe:
    module: str
    version: str | None  # None: not installed
    location: str | None
    function: str | None  # the name whose parameters were read
    params: FunctionParams | None
    note: str  # how it was read, or why it could not be


def _params_of_node(node: ast.FunctionDef | ast.AsyncFunctionDef, where: str) -> FunctionParams:
    a = node.args
    positional = [x.arg for x in a.posonlyargs + a.args]
    with_default = positional[len(positional) - len(a.defaults):] if a.defaults else []
    kw_defaults = [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
                   if d is not None]
    return FunctionParams(tuple(positional), tuple(x.arg for x in a.kwonlyargs),
                          frozenset(with_default + kw_defaults), a.vararg is not None,
                          a.kwarg is not None, where)


def _params_of_callable(fn: object) -> FunctionParams:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    k = inspect.Parameter
    ps = list(sig.parameters.values())
    return FunctionParams(
        tuple(p.name for p in ps if p.kind in (k.POSITIONAL_ONLY, k.POSITIONAL_OR_KEYWORD)),
        tuple(p.name for p in ps if p.kind is k.KEYWORD_ONLY),
        frozenset(p.name for p in ps if p.default is not k.empty),
        any(p.kind is k.VAR_POSITIONAL for p in ps), any(p.kind is k.VAR_KEYWORD for p in ps),
        "inspect")


def package_dir(module: str, search_path: Sequence[str] | None = None) -> Path | None:
    """The directory of top-level package `module`, found without importing anything."""
    spec = importlib.machinery.PathFinder.find_spec(
        module, list(search_path) if search_path is not None else None)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _module_file(root: Path, root_name: str, dotted: str) -> Path | None:
    rel = dotted.split(".")[1:] if dotted != root_name else []
    base = root.joinpath(*rel)
    for cand in (base / "__init__.py", base.with_suffix(".py")):
        if cand.is_file():
            return cand
    return None


def _bindings(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements that may bind a module-level name, in execution order (into if/try)."""
    out: list[ast.stmt] = []
    for st in body:
        if isinstance(st, ast.If):
            out += _bindings(st.body) + _bindings(st.orelse)
        elif isinstance(st, ast.Try):
            out += _bindings(st.body) + [s for h in st.handlers for s in _bindings(h.body)]
            out += _bindings(st.orelse) + _bindings(st.finalbody)
        else:
            out.append(st)
    return out


def _find(root: Path, root_name: str, module: str, names: list[str],
          depth: int = 0) -> FunctionParams | None:
    path = _module_file(root, root_name, module)
    if path is None or depth > 8:
        return None
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: FunctionParams | None = None
    for st in _bindings(tree.body):  # the last binding wins, as when the module runs
        hit = _resolve_stmt(st, root, root_name, module, names, path, depth)
        if hit is not None:
            found = hit
    return found


def _resolve_stmt(st: ast.stmt, root: Path, root_name: str, module: str, names: list[str],
                  path: Path, depth: int) -> FunctionParams | None:
    head, rest = names[0], names[1:]
    if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef) and st.name == head and not rest:
        return _params_of_node(st, f"{path}:{st.lineno}")
    if isinstance(st, ast.ClassDef) and st.name == head and len(rest) == 1:
        for item in st.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == rest[0]:
                return _params_of_node(item, f"{path}:{item.lineno}")
    if isinstance(st, ast.Assign) and isinstance(st.value, ast.Name):
        if any(isinstance(t, ast.Name) and t.id == head for t in st.targets):
            return _find(root, root_name, module, [st.value.id, *rest], depth + 1)
    if isinstance(st, ast.ImportFrom):
        for alias in st.names:
            if (alias.asname or alias.name) == head:
                src = _absolute(module, st, path)
                if src is not None and src.split(".")[0] == root_name:
                    return _find(root, root_name, src, [alias.name, *rest], depth + 1)
    return None


def _absolute(module: str, st: ast.ImportFrom, path: Path) -> str | None:
    if st.level == 0:
        return st.module
    pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    pkg = pkg[: len(pkg) - (st.level - 1)]
    return ".".join(pkg + ([st.module] if st.module else []))


def read_params(module: str, qualname: str,
                search_path: Sequence[str] | None = None) -> FunctionParams | None:
    """Parameters of `module.qualname` (e.g. "deep_ep", "Buffer.low_latency_combine"), or None
    when the package or the function is not found. Never imports the package."""
    if search_path is None and module in sys.modules:
        obj: object = sys.modules[module]
        try:
            for part in qualname.split("."):
                obj = getattr(obj, part)
            return _params_of_callable(obj)
        except (AttributeError, TypeError, ValueError):
            pass  # fall back to the source
    root = package_dir(module, search_path)
    if root is None:
        return None
    return _find(root, module, module, qualname.split("."))


def package_version(module: str, search_path: Sequence[str] | None = None) -> str | None:
    """The version of the `module` that imports first: distribution metadata beside that
    package directory (not another copy's further down the path), else its VERSION file, else
    `__version__` in its `__init__.py`."""
    root = package_dir(module, search_path)
    if root is None:
        return None
    for dist_name in _DISTRIBUTIONS.get(module, (module,)):
        for dist in importlib.metadata.distributions(name=dist_name, path=[str(root.parent)]):
            return str(dist.version)
    if (root / "VERSION").is_file():
        return (root / "VERSION").read_text(encoding="utf-8").strip()
    return _source_version(root) or "unknown"


def _source_version(root: Path) -> str | None:
    """`__version__ = "..."` at the top level of the package's `__init__.py` (source trees
    built in place, like DeepEP's, have no distribution metadata)."""
    init = root / "__init__.py"
    try:
        tree = ast.parse(init.read_text(encoding="utf-8"), filename=str(init))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for st in _bindings(tree.body):
        if (isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant)
                and isinstance(st.value.value, str)
                and any(isinstance(t, ast.Name) and t.id == "__version__" for t in st.targets)):
            return st.value.value
    return None


def probe_package(module: str, candidates: Sequence[str],
                  search_path: Sequence[str] | None = None) -> PackageProbe:
    root = package_dir(module, search_path)
    if root is None:
        return PackageProbe(module, None, None, None, None, "not installed")
    version = package_version(module, search_path)
    for name in candidates:
        try:
            params = read_params(module, name, search_path)
        except (OSError, SyntaxError, UnicodeDecodeError) as exc:
            return PackageProbe(module, version, str(root), name, None, f"unreadable: {exc}")
        if params is not None:
            return PackageProbe(module, version, str(root), name, params,
                                f"read from {params.where}")
    return PackageProbe(module, version, str(root), None, None,
                        f"none of {', '.join(candidates)} found in its Python files")
