"""vLLM general plugin (entry point `vllm.general_plugins`): runs once in every vLLM process.

Invariant: it changes nothing in vLLM. It only verifies, in each process, that the installed vLLM is a version the
adapter supports and that every class-level seam of the table (methods, classes) exists, so an incompatible vLLM
fails at start-up with the seam's name instead of mid-transition. Instance attributes are checked on the live
objects when the scheduler and the frontend start (retire/adapter/*).
"""
from __future__ import annotations

import importlib


def register() -> None:
    try:
        importlib.import_module("vllm.v1.core.sched.scheduler")
    except ImportError:  # not a V1 engine process; nothing to check
        return
    from . import adapter
    from .errors import SeamMissing

    for s in adapter.seams():
        if s.kind not in ("method", "class"):
            continue
        try:
            obj = getattr(importlib.import_module(s.module), s.qualname)
        except (ImportError, AttributeError) as e:
            raise SeamMissing(f"installed vLLM lacks {s.where} ({e}); retire relies on it for "
                              f"{', '.join(s.guarantees)}") from e
        if s.member is not None and not hasattr(obj, s.member):
            raise SeamMissing(f"installed vLLM lacks {s.where}; retire relies on it for {', '.join(s.guarantees)}")
