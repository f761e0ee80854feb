"""`sglang-overlap check`'s look at the served model: is every overlap mode asked for proven on it?

The server refuses an unproven mode once it reads the model's config.json (`sglang_overlap.models`);
`check` answers before that, from the first of: a local folder's config.json, the Hugging Face
cache, the model's name where the package's table lists it (`deepseek-ai/DeepSeek-V3`: no
download needed), or config.json downloaded from the Hugging Face Hub. A refused model is one
error line (as a refused flag is); a model `check` could not see is one line saying why and how to
point it at a local config, and the verdict is not ready: a check that cannot see the model never
says "ready" for it.
"""

from __future__ import annotations

import argparse
import os
import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_overlap.models import TABLE, architecture_of, refusal, requested_modes
from sglang_overlap.settings import OverlapSettings, SettingsError

CONFIG = "config.json"
OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
"""Either set to 1 (as huggingface_hub and transformers read them): nothing is downloaded."""
POINT_AT_LOCAL = f"point --model-path at a local folder holding its {CONFIG}"
DOWNLOAD_TIMEOUT_S = 10.0
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
"""Any set: the Hub is reached through a proxy, so only a download can tell whether it answers."""
CONNECT_TIMEOUT_S = 3.0
NOT_DOWNLOADED = f"its {CONFIG} could not be downloaded"
UNREACHABLE = f"{NOT_DOWNLOADED} (offline: the Hugging Face Hub cannot be reached)"
"""Said alike whether one connection attempt or huggingface_hub's own retries found it out."""


@dataclass(frozen=True)
class ModelCheck:
    """What `check` learned of the served model (`problem` set: it could not see it)."""

    path: str
    source: str | None  # where the architecture was read; None: not checked
    architecture: str | None
    problem: str | None = None
    config: dict[str, Any] | None = field(default=None, repr=False)  # None: not read

    @property
    def checked(self) -> bool:
        return self.problem is None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "checked": self.checked, "source": self.source,
                "architecture": self.architecture, "problem": self.problem}


def known_architecture(model_path: str) -> str | None:
    """The architecture of a Hugging Face id the package's table names (`org/DeepSeek-V3`),
    matched on the id's last part; None for any other path."""
    org, _, name = model_path.partition("/")
    if not org or not name or os.path.exists(model_path):  # a local folder: its config decides
        return None
    for row in TABLE:
        if name.lower() in (m.strip().lower() for m in row.models.split(",")):
            return row.name
    return None


def local_config(model_path: str, revision: str | None) -> tuple[dict[str, Any], str] | None:
    """(config, where it was read) from a local folder or the Hugging Face cache; None when
    neither holds it. SettingsError for a config.json that is there but is not a config: the
    server's own reader (`server_args.read_config`), so check and serve refuse alike."""
    from sglang_overlap.sglang.upstream.server_args import read_config

    return read_config(model_path, revision)


def model_argument(argv: list[str]) -> tuple[str | None, str | None]:
    """(--model-path, --revision) as given in a server argv, read before any parser runs."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--model-path", "--model", dest="model_path", default=None)
    p.add_argument("--revision", default=None)
    try:
        ns, _ = p.parse_known_args(argv)
    except SystemExit:  # e.g. --model-path without a value: the server's parser says so
        return None, None
    return ns.model_path, ns.revision


def check_readable(argv: list[str]) -> None:
    """SettingsError when `argv`'s model has a config.json here that is not a config (the server's
    own reading would end in a traceback); run before the flags are parsed."""
    model_path, revision = model_argument(argv)
    if model_path:
        local_config(model_path, revision)


def _not_here(model_path: str) -> str | None:
    """Why a path that names a local folder cannot be read (None: a Hub id, or no local path)."""
    if os.path.isdir(model_path):
        return f"the folder holds no {CONFIG}"
    if os.path.exists(model_path):
        return f"a file, not a folder holding {CONFIG}"
    if model_path.startswith(("/", ".", "~")) or model_path.count("/") > 1:
        return "no such folder on this machine"
    return None


def _offline() -> str | None:
    for name in OFFLINE_ENV:
        if os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return name
    return None


def _download_problem(exc: Exception, model_path: str, revision: str | None) -> str:
    from huggingface_hub import errors

    head = NOT_DOWNLOADED
    if isinstance(exc, errors.GatedRepoError):
        return f"{head} (gated repository: accept its terms on huggingface.co and log in)"
    if isinstance(exc, errors.RepositoryNotFoundError):
        return f"{head} (no repository {model_path} on the Hugging Face Hub, or it is private)"
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"{head} (no revision {revision} of {model_path})"
    if isinstance(exc, errors.RemoteEntryNotFoundError):
        return f"{head} (the repository has no {CONFIG})"
    if isinstance(exc, errors.HFValidationError):
        return f"not a local folder, and not a Hugging Face repository id ({model_path!r})"
    if isinstance(exc, errors.OfflineModeIsEnabled | errors.LocalEntryNotFoundError):
        return UNREACHABLE
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{head} ({type(exc).__name__}: {first})"


def hub_unreachable(endpoint: str, environ: Mapping[str, str],
                    timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why a TCP connection to `endpoint`'s host fails now (its OSError's name), or None: it
    connects, or a proxy is set (`PROXY_ENV`) and only a download through it can tell.
    huggingface_hub retries an unreachable Hub for ~23 s before it gives up; this answers in
    at most `timeout_s` seconds."""
    if any(environ.get(k) for k in PROXY_ENV):
        return None
    url = urllib.parse.urlsplit(endpoint)
    if not url.hostname:
        return None
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
        with socket.create_connection((url.hostname, port), timeout=timeout_s):
            return None
    except ValueError:  # a port that is not a number: the download names that
        return None
    except OSError as exc:
        return type(exc).__name__


def _download(model_path: str, revision: str | None) -> tuple[dict[str, Any] | None, str]:
    """(config, where) downloaded from the Hub, or (None, why not)."""
    offline = _offline()
    if offline is not None:
        return None, f"{NOT_DOWNLOADED} (offline: {offline} is set)"
    try:
        from huggingface_hub import constants, hf_hub_download
    except ImportError:
        return None, f"{NOT_DOWNLOADED} (huggingface_hub is not installed)"
    if hub_unreachable(constants.ENDPOINT, os.environ) is not None:
        return None, UNREACHABLE
    try:
        path = hf_hub_download(model_path, CONFIG, revision=revision,
                               etag_timeout=DOWNLOAD_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - every failure is named on the report's line
        return None, _download_problem(exc, model_path, revision)
    from sglang_overlap.sglang.upstream.server_args import load_config

    return load_config(str(path), model_path), "the Hugging Face Hub (downloaded)"


def examine(settings: OverlapSettings, values: Any) -> ModelCheck | None:
    """The served model checked against the modes `settings` asks for (None: none asks).
    Raises SettingsError: an unproven mode (the server's own refusal), or a config.json that is
    not one."""
    from sglang_overlap.sglang.upstream.server_args import refuse_model

    modes = requested_modes(settings)
    model_path = str(getattr(values, "model_path", "") or "")
    if not modes or not model_path:
        return None
    revision = getattr(values, "revision", None)
    found = local_config(model_path, revision)
    if found is None and (arch := known_architecture(model_path)) is not None:
        why = refusal(arch, modes)
        if why is not None:
            raise SettingsError(why)
        return ModelCheck(model_path, f"known by name; {CONFIG} not read", arch)
    if found is None:
        if (missing := _not_here(model_path)) is not None:
            return ModelCheck(model_path, None, None, missing)
        config, where = _download(model_path, revision)
        if config is None:
            return ModelCheck(model_path, None, None, where)
        found = config, where
    config, where = found
    refuse_model(config, settings, model_path)
    return ModelCheck(model_path, f"{CONFIG} from {where}", architecture_of(config),
                      config=config)
