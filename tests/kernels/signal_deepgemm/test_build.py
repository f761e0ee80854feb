"""kernels/signal_deepgemm/build.py: the translation unit per release, and nvcc (no GPU needed)
building every signal timing and form against every release's patched headers."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest

from sglang_overlap.kernels.signal_deepgemm import build, headers
from sglang_overlap.kernels.signal_deepgemm.configs import DgSignalConfig
from sglang_overlap.kernels.signal_deepgemm.versions import KERNEL_HEADER, RELEASES

R014, R023, R025 = (RELEASES[v] for v in ("0.1.4.post1", "0.2.3.post2", "0.2.5"))


def test_kernel_source_instantiates_the_patched_template() -> None:
    cfg = DgSignalConfig(128, 192, 4, eager=True, multicast=2, multicast_on_a=True)
    text = build.kernel_source(cfg, release=R014, num_groups=16, n=7168, k=2048, num_sms=128,
                               mode="block", unit_m=64)
    assert f"#include <{KERNEL_HEADER}>" in text
    assert ("cute::UMMA::Major::K, 0, 7168, 2048, 16, 128, 192, 128, 128, 128, 128, 4, 128, "
            "256, 2, true, 128,") in text
    assert text.rstrip().endswith("1, 64, true, false>);\n}".rstrip())
    kw = {"num_groups": 8, "n": 7168, "k": 2048, "num_sms": 132, "unit_m": 64}
    plain = build.kernel_source(DgSignalConfig(64, 160, 7), release=R014, mode="none", **kw)
    assert ", 64, 7, 128, 128, 1, false, 132," in plain and "0, 64, false, false>" in plain
    store = DgSignalConfig(64, 160, 7, store_warp=True)
    assert "2, 64, false, true>" in build.kernel_source(store, release=R014, mode="expert", **kw)
    # signals off: no timing applies (no signalling lane to store from), so it is DeepGEMM's
    for timed in (store, DgSignalConfig(64, 160, 7, eager=True)):
        assert build.kernel_source(timed, release=R014, mode="none", **kw) == plain
    with pytest.raises(ValueError, match="multiple of the signal's 128 rows"):
        build.kernel_source(DgSignalConfig(64, 128, 3), release=R014, num_groups=1, n=256,
                            k=128, num_sms=2, mode="block", unit_m=128)


@pytest.mark.parametrize(("release", "tail"), [
    (R014, "cutlass::bfloat16_t,\n        epilogue::transform::EpilogueIdentity,\n        1, 64,"),
    (R023, "cutlass::bfloat16_t,\n        epilogue::transform::EpilogueIdentity, 128,\n"
           "        1, 64,"),
    (R025, "cutlass::bfloat16_t,\n        128,\n        1, 64,"),
])
def test_each_release_gets_its_template_arguments(release: object, tail: str) -> None:
    text = build.kernel_source(DgSignalConfig(64, 160, 7), release=release,  # type: ignore[arg-type]
                               num_groups=8, n=7168, k=2048, num_sms=132, mode="block", unit_m=64)
    assert tail in text, text


NVCC_CASES = [  # (config, mode): every signal timing, both forms, multicast, a 9-slab store
    (DgSignalConfig(64, 160, 7), "none"),
    (DgSignalConfig(64, 160, 7), "block"),
    (DgSignalConfig(64, 112, 9, eager=True), "expert"),
    (DgSignalConfig(64, 160, 7, store_warp=True), "block"),
    (DgSignalConfig(128, 144, 5, store_warp=True, multicast=2), "expert"),
]


def test_every_signal_timing_compiles_with_nvcc(release: tuple[str, Path], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The patched kernel builds with nvcc (no GPU needed) in every timing and form, against
    each release, and each instantiation is its own cubin."""
    try:
        build.nvcc_path()
    except headers.DgSignalError as exc:
        pytest.skip(str(exc))
    version, root = release
    monkeypatch.setenv(headers.CACHE_ENV, str(tmp_path / "cache"))
    source = headers.locate([str(root)])
    include = headers.prepared_include(source)
    texts = [build.kernel_source(cfg, release=source.spec, num_groups=8, n=7168, k=2048,
                                 num_sms=132, mode=mode, unit_m=64) for cfg, mode in NVCC_CASES]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        cubins = list(pool.map(lambda t: build.compile_cubin(t, include), texts))
    assert len(set(cubins)) == len(NVCC_CASES), version
    for cubin in cubins:
        assert b"sm90_fp8_gemm_1d2d_impl" in cubin.read_bytes()
    assert build.compile_cubin(texts[0], include) == cubins[0]  # cached
