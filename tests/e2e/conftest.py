"""Fixtures for tests that start real SGLang 0.5.23 servers on this CPU machine.

They use the CPU kit (tests/kit: a libcuda and a libibverbs stand-in, the test-only `cpu_shim`
SGLang plugin, the tiny model), built once into $SGLANG_CPU_KIT (default
~/.cache/sglang-overlap/cpu-kit), and for prefill/decode Mooncake over TCP and the smg router
(the `test` extra). Where a piece is missing the tests are skipped with the reason, unless
SGLANG_OVERLAP_REQUIRE_E2E=1 (set by .ci/run): then a missing piece is a failure.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from graph_runs import CONFIGS as GRAPH_CONFIGS
from graph_runs import GraphRuns
from overlap_runs import OverlapRuns
from servers import selected_params

from tests.conftest import REPO, prerequisite_missing
from tests.kit import INSTALL_HINT, Kit, KitMissing, build_kit, find_executable, pd_missing


@pytest.fixture(scope="session")
def cpu_kit() -> Kit:
    if importlib.util.find_spec("sglang") is None or find_executable("sglang") is None:
        prerequisite_missing(f"sglang 0.5.23 not installed: {INSTALL_HINT}")
    try:
        return build_kit()
    except KitMissing as exc:
        reason = f"CPU kit: {exc}"
    prerequisite_missing(reason)  # outside the except: the failure shows this line alone
    raise AssertionError("not reached")


@pytest.fixture(scope="session")
def sglang_cpu_env(cpu_kit: Kit) -> dict[str, str]:
    """Environment variables (on top of os.environ) for an SGLang server on this CPU: the kit's,
    with this checkout first on PYTHONPATH so servers load its sglang_overlap."""
    return cpu_kit.env(os.environ, pythonpath=[str(REPO)])


@pytest.fixture(scope="session")
def sglang_pd_env(sglang_cpu_env: dict[str, str]) -> dict[str, str]:
    """sglang_cpu_env where prefill/decode disaggregation can run (Mooncake, smg)."""
    if (reason := pd_missing()) is not None:
        prerequisite_missing(reason)
    return sglang_cpu_env


@pytest.fixture(scope="session")
def overlap_runs(tiny_dsv3: Path, sglang_cpu_env: dict[str, str],
                 tmp_path_factory: pytest.TempPathFactory) -> OverlapRuns:
    """The servers of overlap_runs.CONFIGS, shared by the overlap and reliability tests."""
    return OverlapRuns(tiny_dsv3, sglang_cpu_env, tmp_path_factory.mktemp("overlap-servers"))


@pytest.fixture(scope="session")
def graph_runs(request: pytest.FixtureRequest, tiny_dsv3: Path, cpu_kit: Kit,
               sglang_cpu_env: dict[str, str],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[GraphRuns]:
    """The servers of graph_runs.CONFIGS (decode through the stand-in graph backend; deepep
    on the kit's deep_ep stand-ins of each combine form). Those the selected tests name
    (parametrized `name`) are planned in CONFIGS order: each loads while the one before answers."""
    deepep = {form: cpu_kit.env(os.environ, pythonpath=[str(REPO)],
                                deepep_form=form)["PYTHONPATH"]
              for form in ("per_expert", "per_block")}
    named = selected_params(request.session.items, "name", fixture="graph_runs")
    runs = GraphRuns(tiny_dsv3, sglang_cpu_env, tmp_path_factory.mktemp("graph-servers"), deepep,
                     [name for name in GRAPH_CONFIGS if name in named])
    yield runs
    runs.close()
