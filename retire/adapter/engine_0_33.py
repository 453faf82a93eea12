"""vLLM 0.33: the engine side is 0.32's unchanged (every seam it touches has the same name and signature; see
`table_0_33` for what changed around them and why it needs no code here)."""
from __future__ import annotations

from .engine_0_32 import *  # noqa: F401,F403
