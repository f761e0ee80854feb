"""The producer tables of this process's GPU (`planning.producer_tables`), read once.

Which GPU: `SGLANG_OVERLAP_PRODUCER_TABLE` (a shipped GPU name such as H100, or a producer JSON
file) when set, else CUDA device 0's name (`torch.cuda.get_device_name`, mapped to a profile
name the way `--overlap-hardware-profile auto` maps it). A GPU without a shipped file, or no
CUDA device, gets `producer_tables.DEFAULT_GPU`'s tables and one log line saying so.
"""

from __future__ import annotations

import logging
import os

from sglang_overlap.planning.cost.profiles import ProfileError, gpu_name_from_device
from sglang_overlap.planning.producer_tables import (
    ProducerTables,
    load_producer_tables,
    tables_for_gpu,
)

log = logging.getLogger(__name__)

TABLE_ENV = "SGLANG_OVERLAP_PRODUCER_TABLE"

_TABLES: list[ProducerTables] = []


def device_gpu() -> str | None:
    """The profile name of CUDA device 0 (its raw name when no profile matches), None without
    a CUDA device."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    try:
        return gpu_name_from_device(name)
    except ProfileError:
        return name


def producer_tables() -> ProducerTables:
    """This process's tables (read on first use; `reset` forgets them)."""
    if not _TABLES:
        spec = os.environ.get(TABLE_ENV)
        if spec:
            tables = load_producer_tables(spec)
            log.info("sglang-overlap SBO producers: %s's tables from %s (%s)", tables.gpu,
                     tables.origin, TABLE_ENV)
        else:
            tables, note = tables_for_gpu(device_gpu())
            if note:
                log.info("sglang-overlap SBO producers: %s", note)
        _TABLES.append(tables)
    return _TABLES[0]


def reset() -> None:
    """Forget the tables read (tests; a tuning run that has just written a file)."""
    _TABLES.clear()
