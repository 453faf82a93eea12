"""Safe-point density (retire/density.py), engine-free: the fine tier runs exactly while revisions arrive.

Oracles stand outside the code under test: the tier a step ran is read from what the stand-in slicer and splitter
were asked to do (their `active`/`arm` calls), the clock from `time.monotonic_ns` around the post, and the MLP's
exactness from the module called whole. Negative controls: a window of 0 or an expired one runs the static tier;
an MLP whose result depends on the row count is never split at the row count that breaks it, and splitting it there
anyway is caught against the whole call.
"""
from __future__ import annotations

import math
import os
import time

import pytest
import torch

from conformance.test_compiled_fallback import _step, _worker
from conformance.test_mlp_split import H, GatedMlp, _splitter
from retire.density import DEFAULT_WINDOW_S, FINE, Density
from retire.mailbox import SLOTS, Mailbox, create_path, key
from retire.safepoints import SafePoints

S = 10 ** 9
STATIC = (8192, 1024)


@pytest.mark.parametrize("last,now,window,want", [
    (0, 5 * S, 30.0, (8192, 1024, "static")),            # no revision ever
    (1 * S, 1 * S, 30.0, (2048, 512, "fine")),           # posted just now
    (1 * S, 31 * S, 30.0, (2048, 512, "fine")),          # the window's last instant
    (1 * S, 31 * S + 1, 30.0, (8192, 1024, "static")),   # one nanosecond past it
    (1 * S, 1 * S, 0.0, (8192, 1024, "static")),         # adaptation off
    (1 * S, 1 * S + S // 4, 0.5, (2048, 512, "fine")),   # a window shorter than a second
    (1, 1, 30.0, (2048, 512, "fine")),                   # any nonzero stamp is a post (0 alone means none)
])
def test_the_fine_tier_runs_exactly_within_the_window_after_a_post(last, now, window, want):
    assert Density(window_s=window).tier(static=STATIC, last_post_ns=last, now_ns=now) == want


def test_the_fine_tier_is_never_coarser_than_the_static_one():
    d = Density(fine=(4096, 256))
    assert d.tier(static=(1024, 512), last_post_ns=S, now_ns=S) == (1024, 256, "fine")
    assert d.tier(static=(8192, 128), last_post_ns=S, now_ns=S) == (4096, 128, "fine")


@pytest.mark.parametrize("kw", [dict(window_s=-1.0), dict(window_s=math.nan), dict(fine=(0, 512)),
                                dict(fine=(2048,)), dict(fine=(2048, -5))])
def test_a_bad_rule_is_refused_by_name(kw):
    with pytest.raises(ValueError, match="safe-point"):
        Density(**kw)


def test_the_smallest_rule_is_accepted_and_reported_as_set():
    d = Density(window_s=0.0, fine=(1, 1))
    assert d.fine == (1, 1)
    assert d.report() == {"window_s": 0.0, "fine_min_tokens": 1, "fine_rows": 1}
    assert Density().with_(window_s=2, fine=[4096, 256]).report() == {"window_s": 2.0, "fine_min_tokens": 4096,
                                                                      "fine_rows": 256}


def test_defaults_are_the_documented_ones():
    assert (Density().window_s, Density().fine) == (DEFAULT_WINDOW_S, FINE) == (30.0, (2048, 512))


@pytest.fixture
def mailbox():
    mb = Mailbox(create_path())
    yield mb
    mb.unlink()


def test_a_post_stamps_the_monotonic_clock_and_a_refused_post_or_a_clear_does_not(mailbox):
    assert mailbox.last_post_ns() == 0
    t0 = time.monotonic_ns()
    mailbox.post("a", 10, 20)
    t1 = time.monotonic_ns()
    stamp = mailbox.last_post_ns()
    assert t0 <= stamp <= t1
    assert Mailbox(mailbox.path).last_post_ns() == stamp  # another process reads the same word
    mailbox.clear("a")
    assert mailbox.last_post_ns() == stamp
    for i in range(SLOTS):
        mailbox.post(f"r{i}", 1, 2)
    full = mailbox.last_post_ns()
    with pytest.raises(RuntimeError, match="full"):
        mailbox.post("one-too-many", 1, 2)
    assert mailbox.last_post_ns() == full  # a refused post changes nothing
    assert mailbox.revoked().keys() == {key(f"r{i}") for i in range(SLOTS)}


class _Recorder:
    """Stands in for the attention slicer and the MLP splitter of an eager worker: records what the safe points
    ask for (the step's threshold and row count), always exact."""

    def __init__(self, min_tokens=STATIC[0], rows=STATIC[1]):
        self.min_tokens, self.slice_tokens, self.rows = min_tokens, rows, rows
        self.calls: list = []

    def active(self, total, min_tokens=None, rows=None):
        self.calls.append(("active", total, min_tokens, rows))
        return total >= min_tokens

    def arm(self, check, rows=None):
        self.calls.append(("arm", rows))
        return []

    def disarm(self, undo):
        self.calls.append(("disarm",))

    def verdict_for(self, rows):
        self.calls.append(("verdict_for", rows))
        return {"exact": True}

    def usable_rows(self, rows):
        return rows if rows not in self.inexact else self.rows

    inexact: tuple = ()


def _safe_points(mailbox, density=None):
    from vllm.config.compilation import CompilationMode

    worker, orig = _worker(CompilationMode.NONE)
    sp = SafePoints(worker, mailbox, min_tokens=1024, block=32, density=density)
    assert sp.install()
    sp.slicer, sp.splitter = _Recorder(), _Recorder()
    return sp, worker.model_runner.execute_model


def _armed(sp, run, n):
    sp.slicer.calls.clear()
    sp.splitter.calls.clear()
    run(_step(n))
    return sp.slicer.calls, sp.splitter.calls


def test_a_step_runs_the_static_tier_until_a_revision_is_posted_then_the_fine_tier(mailbox):
    sp, run = _safe_points(mailbox)
    attn, mlp = _armed(sp, run, 2100)
    assert attn == [("active", 2100, 8192, None)] and mlp == [("active", 2100, 8192, 1024)]
    assert sp.tiers == {"static": 1, "fine": 0}
    mailbox.post("elsewhere", 0, 10)  # any revision of the engine, whichever request
    attn, mlp = _armed(sp, run, 2100)
    assert attn == [("active", 2100, 2048, None), ("arm", 512), ("disarm",)]
    assert mlp == [("active", 2100, 2048, 512), ("arm", 512), ("disarm",)]
    assert sp.tiers == {"static": 1, "fine": 1}
    _armed(sp, run, 1)  # a decode step is not armed: no tier
    assert sp.tiers == {"static": 1, "fine": 1}


def test_negative_control_an_expired_or_disabled_window_keeps_the_static_tier(mailbox):
    sp, run = _safe_points(mailbox, Density(window_s=0.0))
    mailbox.post("x", 0, 10)
    attn, _ = _armed(sp, run, 2100)
    assert attn == [("active", 2100, 8192, None)] and sp.tiers["fine"] == 0
    sp.set_density(Density(window_s=1e-9))  # the post above is older than a nanosecond by now
    attn, _ = _armed(sp, run, 2100)
    assert attn == [("active", 2100, 8192, None)] and sp.tiers == {"static": 2, "fine": 0}


def test_a_fine_row_count_inexact_on_this_kernel_splits_the_mlp_at_the_static_rows(mailbox):
    sp, run = _safe_points(mailbox)
    sp.splitter.inexact = (512,)
    mailbox.post("x", 0, 10)
    attn, mlp = _armed(sp, run, 2100)
    assert attn == [("active", 2100, 2048, None), ("arm", 512), ("disarm",)]  # attention keeps its own fine rows
    assert mlp == [("active", 2100, 2048, 1024), ("arm", 1024), ("disarm",)]


def test_adopting_a_rule_self_checks_its_fine_row_count_first(mailbox):
    sp, _ = _safe_points(mailbox)
    sp.set_density(Density(fine=(4096, 256)))
    assert sp.splitter.calls == [("verdict_for", 256)] and sp.density.fine == (4096, 256)


class RowCountDependent(GatedMlp):
    """An MLP whose kernel result depends on M at 32 rows or fewer (as a GEMM that switches blocking would)."""

    def forward(self, x):
        out = super().forward(x)
        return out + 1 if x.shape[0] <= 32 else out


def test_the_split_runs_only_at_row_counts_whose_self_check_passed():
    sp = _splitter([RowCountDependent()], min_tokens=1, rows=64)
    assert sp.verdict["exact"] and sp.active(10 ** 6)
    assert not sp.active(10 ** 6, rows=16)  # never checked: never split
    bad = sp.verdict_for(32)
    assert not bad["exact"] and "differs" in bad["reason"]
    assert not sp.active(10 ** 6, rows=32)
    assert sp.verdict_for(32) is bad  # checked once per row count
    assert sp.set_rows(32) is bad and not sp.active(10 ** 6)  # the static row count follows its own check


def test_a_tier_falls_back_to_the_static_row_count_where_its_own_is_inexact():
    sp = _splitter([RowCountDependent()], min_tokens=1, rows=64)
    sp.verdict_for(32)
    assert sp.usable_rows(32) == 64 and sp.active(10 ** 6, rows=sp.usable_rows(32))  # failed check: static rows
    assert sp.usable_rows(128) == 64  # never checked: static rows
    assert sp.verdict_for(128)["exact"] and sp.usable_rows(128) == 128
    sp.set_rows(32)  # and where the static rows are inexact too, the MLP runs whole
    assert sp.usable_rows(16) == 32 and not sp.active(10 ** 6, rows=sp.usable_rows(16))


def test_negative_control_splitting_at_an_unchecked_row_count_is_caught_against_the_whole_call():
    m = RowCountDependent()
    sp = _splitter([m], min_tokens=1, rows=64)
    x = torch.randn(256, H).to(torch.bfloat16)  # whole 64-row slices: exact at 64, not at 32
    with torch.inference_mode():
        want = m(x)
        undo = sp.arm(lambda layer, frac: None, rows=32)  # what `active` refuses: split at 32 rows anyway
        got = m(x)
        sp.disarm(undo)
        undo = sp.arm(lambda layer, frac: None, rows=64)
        ok = m(x)
        sp.disarm(undo)
    assert not torch.equal(got, want) and torch.equal(ok, want)


@pytest.mark.parametrize("kw", [dict(safe_point_revision_window_s=-1.0), dict(safe_point_fine_slices=(2048, 0))])
def test_a_bad_engine_option_is_refused_before_anything_starts(kw, monkeypatch):
    """The facade's engine options reach the rule through `Density.with_`: a bad one raises by name before the
    mailbox file exists or an engine process starts (a refused call changes nothing)."""
    from retire import backend, mailbox, shm

    created = []
    for mod in (mailbox, shm):
        monkeypatch.setattr(mod, "create_file", lambda *a, **k: created.append(a) or "/nonexistent")
    env = dict(os.environ)
    with pytest.raises(ValueError, match="safe-point"):
        backend.Backend("no-model-is-started", **kw)
    assert created == [] and dict(os.environ) == env
