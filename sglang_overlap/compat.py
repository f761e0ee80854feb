"""The compatibility table: which overlap path and SBO down-GEMM producer a stack gets.

One source for the README's table (`markdown_table`, checked against README.md by a test) and for
`sglang-overlap check` (`evaluate`). A stack is what is installed: the sglang version, deep_gemm
and deep_ep (version and the combine forms its `low_latency_combine` declares), whether nvcc and
triton are there, and the GPU generation. Each `Row` lists its requirements; a stack matches a row
when it meets all of them, and for a row it misses, each unmet requirement says what to install.

Plain Python: the patched-DeepGEMM releases and the triton releases that build the plugin's
kernels are read from `planning/` (pure data, which the kernels read too); no torch, no sglang,
nothing of `kernels/`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sglang_overlap.planning.deepgemm_releases import RELEASES
from sglang_overlap.planning.sbo_path import PINNED_DEEP_EP, Arch, CombineForm
from sglang_overlap.planning.triton_releases import oldest_building

SUPPORTED_SGLANG = "0.5.23"
"""The one sglang release the hooks are written for: the version guard leaves the plugin inert
under any other, and the `sglang` extra pins exactly this. The package writes the number here
only; everything else formats this constant in."""
SGLANG_DEEP_GEMM = "0.2.3.post2"
"""The sgl-deep-gemm release that `SUPPORTED_SGLANG` pins."""
SGLANG_TRITON = "3.8.0"
"""The triton release `SUPPORTED_SGLANG` installs (its torch pins it)."""


def patched_deep_gemm_versions() -> tuple[str, ...]:
    """The sgl-deep-gemm releases the plugin's DeepGEMM signal patch covers (SM90, with nvcc)."""
    return tuple(sorted(RELEASES, key=_version_key))


def recommended_deep_gemm() -> str:
    """The sgl-deep-gemm to install for the patched producer: SGLang's own pin where the patch
    covers it (no conflict with sglang's requirement), else the newest covered release."""
    versions = patched_deep_gemm_versions()
    return SGLANG_DEEP_GEMM if SGLANG_DEEP_GEMM in versions else versions[-1]


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int("".join(c for c in part if c.isdigit()) or 0)
                 for part in v.replace("post", ".").split("."))


@dataclass(frozen=True)
class Stack:
    """What is installed (None: not installed)."""

    arch: Arch
    sglang: str | None
    deep_ep: str | None
    deep_ep_forms: tuple[CombineForm, ...]  # overlap forms low_latency_combine declares
    deep_gemm: str | None
    nvcc: bool
    triton: bool


@dataclass(frozen=True)
class Requirement:
    what: str  # e.g. "sgl-deep-ep with the per-expert combine form"
    met: Callable[[Stack], bool]
    fix: str  # the exact command (or step) that meets it


@dataclass(frozen=True)
class Row:
    """One line of the table: on these versions, these paths serve."""

    name: str
    gpu: str
    deep_ep: str
    deep_gemm: str
    nvcc: str
    tbo: str  # TBO / two-chunk
    sbo: str  # the SBO path: a planning.sbo_path.SboPath value, or torch_a2a
    producer: str  # who writes the SBO down GEMM's signals
    flags: str  # which overlap flags work
    needs: tuple[Requirement, ...] = field(repr=False)

    def missing(self, stack: Stack) -> list[Requirement]:
        return [r for r in self.needs if not r.met(stack)]


def _sglang() -> Requirement:
    return Requirement(f"sglang {SUPPORTED_SGLANG}", lambda s: s.sglang == SUPPORTED_SGLANG,
                       f"pip install sglang=={SUPPORTED_SGLANG}")


def _arch(arch: Arch, name: str) -> Requirement:
    return Requirement(f"an {name} GPU ({arch})", lambda s: s.arch == arch,
                       f"run on an {name} GPU (`sglang-overlap check --assume-arch {arch}` "
                       "answers for one from any machine)")


def _form(form: CombineForm, fix: str) -> Requirement:
    return Requirement(f"deep_ep whose low_latency_combine takes the {form.replace('_', '-')} "
                       "form", lambda s: form in s.deep_ep_forms, fix)


def _patched_dg() -> Requirement:
    versions = patched_deep_gemm_versions()
    return Requirement(f"sgl-deep-gemm {' / '.join(versions)} (the signal patch's releases)",
                       lambda s: s.deep_gemm in versions,
                       f"pip install sgl-deep-gemm=={recommended_deep_gemm()}")


_NVCC = Requirement("nvcc (the patched kernel is JIT-compiled)", lambda s: s.nvcc,
                    "install the CUDA toolkit's nvcc and set CUDA_HOME")
def _triton() -> Requirement:
    return Requirement(f"triton {oldest_building('sliced')} or later (the plugin's Triton "
                       "signal GEMM)", lambda s: s.triton, f"pip install triton=={SGLANG_TRITON}")
_DEEP_EP = Requirement("deep_ep installed", lambda s: s.deep_ep is not None,
                       f"pip install {PINNED_DEEP_EP}")
_PER_EXPERT = _form("per_expert", f"pip install {PINNED_DEEP_EP}")
_PER_BLOCK = _form("per_block", "build DeepEP's antgroup-opt tree (no released sgl-deep-ep has "
                   "the per-block form)")


def rows() -> tuple[Row, ...]:
    """The table, in the order the SBO decision prefers (`planning.sbo_path`): the first row a
    stack matches is the path it serves."""
    dg = "sgl-deep-gemm " + " / ".join(patched_deep_gemm_versions())
    deepep_flags = "all"
    hopper = (_sglang(), _arch("sm90", "Hopper"))
    return (
        Row("sm90-per-block", "Hopper (SM90)", "DeepEP antgroup-opt build", dg, "yes", "deepep",
            "fine_grained", "patched DeepGEMM", deepep_flags,
            (*hopper, _PER_BLOCK, _patched_dg(), _NVCC, _triton())),
        Row("sm90-patched-deepgemm", "Hopper (SM90)", "sgl-deep-ep 0.1.2.post1", dg, "yes",
            "deepep", "per_expert", "patched DeepGEMM (fast path)", deepep_flags,
            (*hopper, _PER_EXPERT, _patched_dg(), _NVCC, _triton())),
        Row("sm90-per-block-triton", "Hopper (SM90)", "DeepEP antgroup-opt build", "other versions",
            "any", "deepep", "fine_grained", "Triton (or DeepGEMM slices)", deepep_flags,
            (*hopper, _PER_BLOCK, _triton())),
        Row("sm90-triton", "Hopper (SM90)", "sgl-deep-ep 0.1.2.post1", "other versions",
            "any", "deepep", "per_expert", "Triton (or DeepGEMM slices)", deepep_flags,
            (*hopper, _PER_EXPERT, _triton())),
        Row("sm90-no-signal", "Hopper (SM90)", "no overlap form", "any", "any", "deepep",
            "shared_expert_only", "none", "all but --sbo-down-gemm-overlap force and "
            "--sbo-signal-granularity expert or block", (*hopper, _DEEP_EP)),
        Row("sm100", "Blackwell (SM100)", "sgl-deep-ep 0.1.2.post1", "SGLang's pin", "any",
            "deepep", "upstream_blackwell", "SGLang's own (flashinfer_cutedsl)",
            "all but --sbo-signal-granularity block",
            (_sglang(), _arch("sm100", "Blackwell"), _PER_EXPERT)),
        Row("any-torch-a2a", "any, CPU included", "none", "none", "no",
            "torch_a2a (--tp >= 2)", "torch_a2a", "the plugin's torch experts",
            "all but the --sbo-* flags", (_sglang(),)),
    )


@dataclass(frozen=True)
class Verdict:
    """`evaluate`'s answer: the rows this stack matches and, for the fast path of its GPU
    generation, what is missing and the commands that fix it."""

    matched: tuple[str, ...]
    fast_path: str | None  # the row name of this generation's fastest path (None: no GPU row)
    fast_path_serves: bool
    missing: tuple[tuple[str, str], ...]  # (requirement, fix) for the fast path

    def to_dict(self) -> dict[str, object]:
        return {"matched": list(self.matched), "fast_path": self.fast_path,
                "fast_path_serves": self.fast_path_serves,
                "missing": [{"needs": w, "fix": f} for w, f in self.missing]}


def evaluate(stack: Stack) -> Verdict:
    """The rows `stack` matches, and what its generation's fast path still needs."""
    table = rows()
    matched = tuple(r.name for r in table if not r.missing(stack))
    if stack.sglang != SUPPORTED_SGLANG:
        matched = ()  # the version guard keeps the plugin inert: no row serves
    gen = {"sm90": "sm90-patched-deepgemm", "sm100": "sm100"}.get(stack.arch)
    if gen is None:
        anywhere = next(r for r in table if r.name == "any-torch-a2a")
        needs = tuple((r.what, r.fix) for r in anywhere.missing(stack))
        return Verdict(matched, None, False, needs)
    fast = next(r for r in table if r.name == gen)
    missing = tuple((r.what, r.fix) for r in fast.missing(stack))
    serves = not missing or "sm90-per-block" in matched  # the patched producer, per block
    return Verdict(matched, gen, serves, () if serves else missing)


def fast_path_install() -> str:
    """The command that installs the Hopper fast path's kernels (nvcc comes with CUDA)."""
    return f"pip install {PINNED_DEEP_EP} sgl-deep-gemm=={recommended_deep_gemm()}"


_COLUMNS = ("GPU", "deep_ep", "deep_gemm", "nvcc", "EP backend", "SBO path",
            "SBO down-GEMM producer", "overlap flags that work")


def markdown_table() -> str:
    """The table as it appears in README.md (`SUPPORTED_SGLANG` on every row)."""
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for r in rows():
        cells = (r.gpu, r.deep_ep, r.deep_gemm, r.nvcc, r.tbo, f"`{r.sbo}`", r.producer, r.flags)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = ["Requirement", "Row", "Stack", "SUPPORTED_SGLANG", "Verdict", "evaluate",
           "fast_path_install", "markdown_table", "patched_deep_gemm_versions", "rows"]
