"""vLLM 0.33: engine-free construction is 0.32's unchanged (same Scheduler constructor and Request fields)."""
from __future__ import annotations

from .enginefree_0_32 import *  # noqa: F401,F403
from .enginefree_0_32 import _hasher  # noqa: F401
