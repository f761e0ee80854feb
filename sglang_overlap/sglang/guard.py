"""The guard against SGLang version drift: is the installed sglang what the hooks were written for?

Every hook names an upstream function (`HookSpec.target`) and the fingerprint of that function in
the supported SGLang (`HookSpec.fingerprint`): a hash of its syntax tree, so formatting and
comments do not count, any change of code does. `check` reads a target from its live function
where its module is already imported (what will actually be hooked), else from the installed
sglang's file with `ast` (nothing is imported, so it is cheap enough for `register()` in every
process), and reports the first thing that does not match: the version, a target that is gone, or
a target whose code changed.

`check_features` does the same per feature (`hooks.FEATURES`): the first changed pin of a feature
turns that feature off (`register()` installs none of its hooks, `server_args.py` refuses its
flags naming the pin); a changed pin of a CPU-only hook turns its feature off only on CPU
servers; a wrong version, or a changed pin of "args" or of `hooks.SHARED_PINS`, turns every
feature off.

Upgrading SGLang: run `python -m sglang_overlap.sglang.guard`, read the upstream diff of every
target it lists as changed, adapt the hook, then paste the new fingerprint.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import inspect
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_overlap.compat import SUPPORTED_SGLANG
from sglang_overlap.modes import Feature


@dataclass(frozen=True)
class GuardResult:
    installed: str | None
    """The installed sglang version (None: not installed)."""
    mismatch: str | None
    """The first problem found, in words (None: everything matches)."""

    @property
    def ok(self) -> bool:
        return self.mismatch is None

    def message(self) -> str:
        return (f"sglang-overlap supports sglang {SUPPORTED_SGLANG}; installed: "
                f"sglang {self.installed}: {self.mismatch}")


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _sglang_dir() -> Path | None:
    from sglang_overlap.kernels.package_source import package_dir

    return package_dir("sglang")


def _module_file(root: Path, dotted: str) -> Path | None:
    base = root.joinpath(*dotted.split(".")[1:])
    for cand in (base / "__init__.py", base.with_suffix(".py")):
        if cand.is_file():
            return cand
    return None


def _node_in(body: list[ast.stmt], names: list[str]) -> ast.AST | None:
    head, rest = names[0], names[1:]
    found: ast.AST | None = None
    for st in body:  # the last definition wins, as when the module runs
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef) and st.name == head:
            found = st if not rest else None
        elif isinstance(st, ast.ClassDef) and st.name == head:
            found = _node_in(st.body, rest) if rest else st
    return found


class _Sources:
    """Parsed upstream files, each read once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._trees: dict[Path, tuple[str, ast.Module]] = {}

    def split(self, target: str) -> tuple[str, list[str], Path] | None:
        """(module, attribute path, module file) of `module.func` / `module.Class.method`."""
        parts = target.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:cut])
            path = _module_file(self.root, module)
            if path is not None:
                return module, parts[cut:], path
        return None

    def node(self, path: Path, attrs: list[str]) -> ast.AST | None:
        """The definition of `attrs` in the file at `path`."""
        if path not in self._trees:
            text = path.read_text(encoding="utf-8")
            self._trees[path] = (text, ast.parse(text, filename=str(path)))
        return _node_in(self._trees[path][1].body, attrs)


def _digest(node: ast.AST) -> str:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        node.decorator_list = []  # a decorator is not the function's code
    return "src:" + hashlib.sha256(_canonical(node).encode()).hexdigest()[:12]


def _canonical(value: object) -> str:
    """The syntax tree as text, the same on every Python that parses it alike: `ast.dump` is not
    (3.12 adds `type_params=[]` to every definition, 3.13 leaves out empty fields), so a field
    that is None or an empty list is left out here on every version."""
    if isinstance(value, ast.AST):
        fields = (f"{name}={_canonical(v)}" for name in value._fields
                  if (v := getattr(value, name, None)) is not None and v != [])
        return f"{type(value).__name__}({', '.join(fields)})"
    if isinstance(value, list):
        return f"[{', '.join(_canonical(v) for v in value)}]"
    return repr(value)


def _live(module: object, attrs: list[str]) -> object:
    """The function at `attrs` of an imported module, unwrapped from any hook (None: gone)."""
    obj: object = module
    for name in attrs:
        obj = inspect.getattr_static(obj, name, None)
        if obj is None:
            return None
    if isinstance(obj, property):
        obj = obj.fget
    return inspect.unwrap(getattr(obj, "__func__", obj))  # type: ignore[arg-type]


def _live_node(sources: _Sources, live: object) -> ast.AST | None:
    """The live function's definition, read from the file it was defined in, by its qualified
    name: the same tree the file path reads (a dedented `getsource` would also dedent the lines
    of a multi-line docstring, so the digest would differ). None: not found that way."""
    qualname = getattr(live, "__qualname__", "")
    try:
        path = inspect.getsourcefile(live)  # type: ignore[arg-type]
    except TypeError:
        return None
    if not path or not qualname or "<locals>" in qualname or not Path(path).is_file():
        return None
    return sources.node(Path(path), qualname.split("."))


def fingerprint(sources: _Sources, target: str) -> str | None:
    """`src:<sha>` of the target's syntax tree, None when the target is gone."""
    where = sources.split(target)
    if where is None:
        return None
    module, attrs, path = where
    if module in sys.modules:  # what will be hooked: the live function
        live = _live(sys.modules[module], attrs)
        if live is None:
            return None
        node = _live_node(sources, live)
        if node is not None:
            return _digest(node)
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(live)))  # type: ignore[arg-type]
        except (OSError, TypeError):
            return "src:unreadable"  # no source: not the function the hook was written for
        return _digest(tree.body[0])
    node = sources.node(path, attrs)
    return None if node is None else _digest(node)


def check(pins: Iterable[tuple[str, str]], version: str | None = None) -> GuardResult:
    """Check the installed sglang against `pins` ((target, fingerprint) pairs): the version first,
    then each target in order. `version` overrides the installed one (tests)."""
    version = version if version is not None else installed_version()
    if version is None:
        return GuardResult(None, "sglang is not installed")
    if version != SUPPORTED_SGLANG:
        return GuardResult(version, "this version is not supported")
    root = _sglang_dir()
    if root is None:
        return GuardResult(version, "the sglang package directory is not found")
    sources = _Sources(root)
    for target, want in pins:
        problem = _pin_problem(sources, target, want)
        if problem is not None:
            return GuardResult(version, problem)
    return GuardResult(version, None)


@dataclass(frozen=True)
class FeatureVerdict:
    """Which features the installed sglang can serve."""

    installed: str | None
    off: dict[str, str]
    """feature -> the first problem found, in words (every feature is here when all are off)."""
    off_on_cpu: dict[str, str]
    """feature -> the first changed pin of its CPU-only hooks (off on CPU servers only)."""
    changed_targets: frozenset[str]
    """Hooked targets whose own pins changed: never installed."""

    def message(self, feature: str, *, cpu: bool = False) -> str | None:
        """The guard's message for `feature` on this server, None when it can be served."""
        problem = self.off.get(feature) or (self.off_on_cpu.get(feature) if cpu else None)
        if problem is None:
            return None
        return GuardResult(self.installed, problem).message()


def check_features(specs: Iterable[Any], shared: Iterable[Any] = (),
                   version: str | None = None) -> FeatureVerdict:
    """Check `specs` (HookSpec / ResolutionSpec: `.feature`, `.pins()`, `.cpu_only`) and the
    `shared` pins (`.target`, `.fingerprint`) against the installed sglang."""
    specs = list(specs)
    features = {s.feature for s in specs}
    first = check([], version)
    if not first.ok:
        return FeatureVerdict(first.installed, dict.fromkeys(features, str(first.mismatch)), {},
                              frozenset(s.target if hasattr(s, "target") else s.step_target
                                        for s in specs))
    sources = _Sources(_sglang_dir())  # type: ignore[arg-type]  # check() found it
    off: dict[str, str] = {}
    off_on_cpu: dict[str, str] = {}
    changed: set[str] = set()
    for pin in shared:
        problem = _pin_problem(sources, pin.target, pin.fingerprint)
        if problem is not None:
            return FeatureVerdict(first.installed, dict.fromkeys(features, problem), {},
                                  frozenset())
    for spec in specs:
        for i, pin in enumerate(spec.pins()):
            problem = _pin_problem(sources, pin.target, pin.fingerprint)
            if problem is None:
                continue
            if i == 0:
                changed.add(pin.target)
            where = off_on_cpu if getattr(spec, "cpu_only", False) else off
            where.setdefault(spec.feature, problem)
            break
    if Feature.ARGS in off:
        off = dict.fromkeys(features, off[Feature.ARGS])
    return FeatureVerdict(first.installed, off, off_on_cpu, frozenset(changed))


def _pin_problem(sources: _Sources, target: str, want: str) -> str | None:
    got = fingerprint(sources, target)
    if got is None:
        return f"hook target {target} does not exist"
    if got != want:
        return (f"hook target {target} changed (source fingerprint {got}, the hook was written "
                f"for {want})")
    return None


def current_fingerprints(targets: Iterable[str]) -> dict[str, str | None]:
    """The installed sglang's fingerprint of each target (None: gone)."""
    root = _sglang_dir()
    if root is None:
        raise RuntimeError("sglang is not installed")
    sources = _Sources(root)
    return {t: fingerprint(sources, t) for t in targets}


def main() -> int:
    from sglang_overlap.sglang.hooks import all_pins

    pins = all_pins()
    now = current_fingerprints(t for t, _ in pins)
    changed = 0
    for target, want in pins:
        got = now[target]
        mark = "ok     " if got == want else "CHANGED"
        changed += got != want
        print(f"{mark} {target}  pinned {want}  installed {got}")
    print(f"sglang {installed_version()}: {changed} of {len(pins)} targets differ")
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
