"""Build (once) the CPU serving kit the end-to-end tests run real SGLang 0.5.23 servers with.

What it builds, from the files beside this one:
  lib/libcuda.so.1      a stand-in driver: sgl_kernel is always imported and links libcuda.so.1
  lib/libibverbs.so.1   rdma-core's "no RDMA device": Mooncake's engine links libibverbs.so.1,
                        the kit runs Mooncake over TCP on loopback
  site/                 the test-only SGLang plugin `cpu_shim` (cpu_shim/), pip-installed there
                        as its own distribution so SGLang finds its entry point on PYTHONPATH
  env.sh                the environment a server needs (`source` it to serve by hand)
  deepep-<form>/        stand-ins for deep_ep and deep_gemm on torch.distributed (standins/),
                        one folder per DeepEP overlap form (per_expert: sgl-deep-ep 0.1.2.post1,
                        per_block: the antgroup-opt tree); on PYTHONPATH only for servers that
                        ask for them (`Kit.env(..., deepep_form=...)`)
and, apart, tiny-dsv3/: the tiny random DeepSeek-V3 of make_tiny_dsv3.py.

Each lands in $SGLANG_CPU_KIT (default ~/.cache/sglang-overlap/cpu-kit) in a folder named by a
hash of its sources (and of the torch/transformers versions, for the model), built in a scratch
folder and renamed into place: a rebuild happens only when a source changes, and two test runs
building at once both end up with one complete copy. Nothing here touches the Python environment.

The PD pieces (Mooncake's transfer engine, the smg router) are PyPI packages of the `test` extra;
`pd_missing()` says when they are absent.

    python -m tests.kit        # build or find it, print its folder and how to use it by hand
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
KIT_SOURCES = ("build.py", "libcuda_stub.c", "libibverbs_stub.c", "libibverbs.map",
               "cpu_shim/pyproject.toml", "cpu_shim/sglang_cpu_shim/__init__.py",
               "cpu_shim/sglang_cpu_shim/graphs.py", "cpu_shim/sglang_cpu_shim/deep_ep_gloo.py",
               "cpu_shim/sglang_cpu_shim/deep_ep_normal.py",
               "cpu_shim/sglang_cpu_shim/deepep.py", "cpu_shim/sglang_cpu_shim/normal_experts.py",
               "cpu_shim/sglang_cpu_shim/streams.py",
               "standins/deep_ep_per_expert/deep_ep/__init__.py",
               "standins/deep_ep_per_block/deep_ep/__init__.py",
               "standins/deep_gemm/deep_gemm/__init__.py")
# The deep_ep trees the kit stands in for, by the combine overlap form they declare.
DEEP_EP_FORMS = ("per_expert", "per_block")
MODEL_SOURCES = ("make_tiny_dsv3.py",)
MODEL_PACKAGES = ("torch", "transformers", "tokenizers")
INSTALL_HINT = "pip install -e '.[sglang,test]' from the checkout"
# What every server of the tests runs with, besides the kit's paths.
SERVER_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",          # SGLang's CPU engine; also switches the shim on
    "TORCHDYNAMO_DISABLE": "1",            # no torch.compile on 2 slow cores
    "SGLANG_HOST_IP": "127.0.0.1",         # every address SGLang advertises stays on loopback
    "MOONCAKE_PROTOCOL": "tcp",            # PD: Mooncake over TCP, no RDMA
    "MC_FORCE_TCP": "1",
    "SGLANG_CPU_OMP_THREADS_BIND": "0|1",  # one core per rank for --tp 2
    "PYTHONUNBUFFERED": "1",
}


class KitMissing(RuntimeError):
    """A prerequisite of the kit is missing; the message (one line) says which and how to get it."""


def cache_root() -> Path:
    """$SGLANG_CPU_KIT, else ~/.cache/sglang-overlap/cpu-kit (XDG_CACHE_HOME respected)."""
    if os.environ.get("SGLANG_CPU_KIT"):
        return Path(os.environ["SGLANG_CPU_KIT"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "sglang-overlap" / "cpu-kit"


def _digest(files: Sequence[str], extra: Sequence[str] = ()) -> str:
    h = hashlib.sha256()
    for name in files:
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes() + b"\0")
    for item in extra:
        h.update(item.encode() + b"\0")
    return h.hexdigest()[:16]


def _cached(root: Path, name: str, build: Callable[[Path, Path], None]) -> Path:
    """root/name, built by `build(scratch, root/name)` if absent (into scratch, then renamed);
    a concurrent build of the same name is harmless."""
    target = root / name
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        build(scratch, target)
        try:
            scratch.rename(target)
        except OSError:
            if not target.is_dir():  # not another build winning the race: a real failure
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _run(argv: Sequence[str], what: str) -> None:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"CPU kit: {what} failed ({proc.returncode}): {' '.join(argv)}\n"
                           f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}")


def _compiler() -> str:
    for name in (os.environ.get("CC"), "gcc", "cc"):
        found = shutil.which(name) if name else None
        if found:
            return found
    raise KitMissing("no C compiler (gcc or cc on PATH, or $CC): the CPU kit compiles stand-ins "
                     "for libcuda.so.1 and libibverbs.so.1 (Debian/Ubuntu: apt-get install gcc)")


def _require_modules(names: Sequence[str], why: str) -> None:
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        raise KitMissing(f"{', '.join(missing)} not installed in {sys.prefix} ({why}): "
                         f"{INSTALL_HINT}")


def _build_kit(cc: str, out: Path, final: Path) -> None:
    lib = out / "lib"
    lib.mkdir()
    _run([cc, "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o",
          str(lib / "libcuda.so.1"), str(HERE / "libcuda_stub.c")], "compiling libcuda_stub.c")
    _run([cc, "-shared", "-fPIC", "-O1", "-Wl,-soname,libibverbs.so.1",
          f"-Wl,--version-script,{HERE / 'libibverbs.map'}", "-o", str(lib / "libibverbs.so.1"),
          str(HERE / "libibverbs_stub.c")], "compiling libibverbs_stub.c")
    # pip builds in the source folder: build a copy (the checkout may be read-only).
    src = out / "src" / "cpu_shim"
    shutil.copytree(HERE / "cpu_shim", src, ignore=shutil.ignore_patterns("__pycache__"))
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
          "--no-build-isolation", "--target", str(out / "site"), str(src)],
         "installing the cpu_shim plugin")
    shutil.rmtree(out / "src")
    for form in DEEP_EP_FORMS:
        shutil.copytree(HERE / "standins" / f"deep_ep_{form}" / "deep_ep",
                        out / f"deepep-{form}" / "deep_ep")
        shutil.copytree(HERE / "standins" / "deep_gemm" / "deep_gemm",
                        out / f"deepep-{form}" / "deep_gemm")
    kit = Kit(final)
    lines = [f"export {k}={shlex.quote(v)}" for k, v in SERVER_ENV.items()]
    lines += [f"export LD_LIBRARY_PATH={kit.lib}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}",
              f"export PYTHONPATH={kit.site}${{PYTHONPATH:+:$PYTHONPATH}}"]
    (out / "env.sh").write_text("# source me: SGLang 0.5.23 servers on this CPU\n"
                                + "\n".join(lines) + "\n")


@dataclass(frozen=True)
class Kit:
    path: Path

    @property
    def lib(self) -> Path:
        return self.path / "lib"

    @property
    def site(self) -> Path:
        return self.path / "site"

    def deepep(self, form: str) -> Path:
        """The folder of the deep_ep + deep_gemm stand-ins of overlap form `form`."""
        if form not in DEEP_EP_FORMS:
            raise ValueError(f"deep_ep form must be one of {DEEP_EP_FORMS}, got {form!r}")
        return self.path / f"deepep-{form}"

    def env(self, base: Mapping[str, str], pythonpath: Sequence[str] = (),
            deepep_form: str | None = None) -> dict[str, str]:
        """Variables to set on top of `base` for a server: SERVER_ENV, the stubs first on
        LD_LIBRARY_PATH, `pythonpath` then the shim (then, with `deepep_form`, the deep_ep and
        deep_gemm stand-ins of that form) before base's PYTHONPATH."""
        def prepend(key: str, first: Sequence[str]) -> str:
            rest = [p for p in base.get(key, "").split(os.pathsep) if p]
            return os.pathsep.join([*first, *rest])

        return {**SERVER_ENV,
                "LD_LIBRARY_PATH": prepend("LD_LIBRARY_PATH", [str(self.lib)]),
                "PYTHONPATH": prepend("PYTHONPATH", [*pythonpath, str(self.site), *(
                    [str(self.deepep(deepep_form))] if deepep_form else [])])}


def build_kit(root: Path | None = None) -> Kit:
    """The kit for the current sources (built now if needed). Raises KitMissing."""
    cc = _compiler()
    _require_modules(["pip", "setuptools"], "the kit pip-installs its cpu_shim plugin offline")
    key = _digest(KIT_SOURCES, [f"py{sys.version_info.major}.{sys.version_info.minor}"])
    return Kit(_cached(root or cache_root(), f"kit-{key}",
                       lambda out, final: _build_kit(cc, out, final)))


def build_tiny_dsv3(root: Path | None = None) -> Path:
    """The tiny random DeepSeek-V3 checkpoint folder (built now if needed). Raises KitMissing."""
    _require_modules(MODEL_PACKAGES, "make_tiny_dsv3.py builds the model with them")
    versions = [f"{p}=={importlib.metadata.version(p)}" for p in MODEL_PACKAGES]

    def build(out: Path, _final: Path) -> None:
        _run([sys.executable, str(HERE / "make_tiny_dsv3.py"), str(out)],
             "make_tiny_dsv3.py")

    return _cached(root or cache_root(), f"tiny-dsv3-{_digest(MODEL_SOURCES, versions)}", build)


def find_executable(name: str) -> str | None:
    """`name` next to this Python (its environment's scripts), else on PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.is_file() else shutil.which(name)


def pd_missing() -> str | None:
    """Why prefill/decode disaggregation cannot run here (None when it can)."""
    missing = []
    if importlib.util.find_spec("mooncake") is None:
        missing.append("mooncake-transfer-engine-non-cuda (Mooncake's transfer engine)")
    if find_executable("smg") is None:
        missing.append("smg (the PD router)")
    if not missing:
        return None
    return f"PD tests need {' and '.join(missing)}: {INSTALL_HINT}"
