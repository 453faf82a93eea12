"""vLLM general plugin (entry point `vllm.general_plugins`): runs once in every vLLM process.

Invariant: it changes nothing in vLLM. It only verifies, in each process, that the seams retire relies on exist, so
an incompatible vLLM fails at start-up with a clear message instead of mid-transition.
"""
from __future__ import annotations


def register() -> None:
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
    except ImportError:  # not a V1 engine process; nothing to check
        return
    missing = [a for a in ("add_request", "finish_requests", "update_from_output", "schedule") if not hasattr(Scheduler, a)]
    if missing:
        from .errors import SeamMissing
        raise SeamMissing(f"vLLM Scheduler lacks {missing}; retire supports vLLM 0.32")
