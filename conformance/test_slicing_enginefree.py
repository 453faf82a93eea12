"""Attention slicing without an engine (retire/slicing.py): the slicer's orchestration of one armed step, its
install-time verdict, the worker RPCs `control` and `logits_probe`, and the L2 read behind the kernel's q-tile.

The kernel itself is not faked where it matters: the split's bit-identity runs the real CPU attention kernel in
test_safepoint_model.py, and the engine tests run the sliced step against an unsliced one. Here the adapter's worker
seam is a recorder, so what is checked is the invariant the module states around the kernel:
- a sliced call runs the step's own schedule as consecutive slices, in order, with a safe point (`check(layer,
  fraction done)`) between two slices and none before the first; the plan is built once per step's metadata;
- a call the kernel cannot slice, or a plan of one slice, runs the original call once, with no safe point;
- slicing is active only with an exact verdict, switched on, and at or above its step size; `disarm` leaves nothing
  installed;
- the verdict is exact only for a tile the self-check passed, and says why otherwise;
- `control` checks every value before applying any: a refused call changes nothing.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from retire import slicing
from retire.density import Density
from retire.slicing import AttentionSlicer

INFO = {"isa": "vec", "head_dim": 64, "num_heads": 8, "num_kv_heads": 4}


class FakeWorkerSeam:
    """The adapter's worker seam as the slicer uses it, recording every call."""

    def __init__(self, info=None, *, prepare=None, layout=None, worker=None):
        self.info = dict(INFO if info is None else info)
        self.prepare, self.layout, self.worker = prepare, layout, worker
        self.calls: list = []
        self.parsed = 0
        self.can_slice = True
        self.sliceable_seen: list = []

    def attention_modules(self, layer):
        return layer.attn

    def kernel_info(self, mod):
        self.calls.append(("kernel_info", mod))
        return self.info

    def runner(self, worker):
        assert self.worker is None or worker is self.worker, "the slicer read another worker's model"
        return SimpleNamespace(model=torch.nn.Linear(2, 2, dtype=torch.bfloat16))

    def prepare_isa(self, isa):
        self.calls.append(("prepare", isa))
        return self.prepare

    def metadata_layout_ok(self, info, dtype, threads):
        self.calls.append(("layout", info, dtype, threads))
        return self.layout

    def wrap_attention(self, m, fwd):
        m.wrapped = fwd

        def undo():
            m.wrapped = None
        return undo

    def sliceable(self, md):
        self.sliceable_seen.append(md)
        return self.can_slice

    def parse_schedule(self, sm):
        self.parsed += 1
        return dict(sm, parsed=True)

    def build_schedule(self, parsed, s, first):
        assert parsed.get("parsed"), "a schedule built from something other than the parsed metadata"
        return ("sched", s, first)

    def reset_schedule(self, sched):
        self.calls.append(("reset", sched[1]))

    def with_schedule(self, md, sched):
        return ("md", md, sched[1])


def _layers(n=2):
    return [SimpleNamespace(attn=[SimpleNamespace(wrapped=None)]) for _ in range(n)]


def _slicer(monkeypatch, seam=None, *, exact_tiles=None, **kw):
    """An AttentionSlicer on the fake seam; the self-check passes for `exact_tiles` (default: every tile)."""
    seam = seam or FakeWorkerSeam()
    monkeypatch.setattr(slicing.adapter, "worker", lambda: seam)
    monkeypatch.setattr(slicing, "_l2_bytes", lambda: 2 * 1024 * 1024)
    checked = []

    def selfcheck(wk, info, dtype, tile):
        assert wk is seam and info == seam.info and dtype == torch.bfloat16, (wk, info, dtype)
        checked.append(tile)
        ok = exact_tiles is None or tile in exact_tiles
        return {"exact": ok, "slices": 4, "max_abs_diff": 0.0 if ok else 0.5,
                "reason": None if ok else "differs by up to 0.5"}

    monkeypatch.setattr(slicing, "selfcheck", selfcheck)
    worker = seam.worker = object()
    sl = AttentionSlicer(worker, _layers(), **kw)
    return sl, seam, checked


def _md(n_tokens: int, qlens: list[int]):
    """Step metadata of one thread holding one work item per request (whole rows, no split KV)."""
    qsl = [0]
    for q in qlens:
        qsl.append(qsl[-1] + q)
    items = [[r, 0, q, 0, q, 0, -1, 0] for r, q in enumerate(qlens)]
    return SimpleNamespace(scheduler_metadata={"cu": [0, len(items)], "items": items},
                           query_start_loc=torch.tensor(qsl), seq_lens=torch.tensor(qlens),
                           num_actual_tokens=n_tokens)


def test_sliced_call_runs_the_slices_in_order_with_a_safe_point_between_two(monkeypatch):
    sl, seam, _ = _slicer(monkeypatch, min_tokens=8, slice_tokens=1024)
    tile = sl.verdict["tile_rows"]
    checks, runs = [], []
    undo = sl.arm(lambda layer, f: checks.append((layer, f)), rows=1024)
    assert sl._rows == 1024 and all(m.wrapped is not None for ly in sl.attn for m in ly)
    n = 4 * tile
    md = _md(n, [n])

    def orig(layer, q, k, v, kvc, md_, output=None, **kw):
        assert (layer, q, k, v, kvc, output, kw) == ("L", "q", "k", "v", "kv", "OUT", {"extra": 1})
        assert md_[1] is md  # the step's metadata, with a slice's schedule
        runs.append(md_)
        return "orig-return"

    fwd = sl.attn[1][0].wrapped
    out = fwd(orig, "L", "q", "k", "v", "kv", md, output="OUT", extra=1)
    assert out == "OUT" and seam.sliceable_seen == [md]  # the caller's output buffer, filled slice by slice
    scheds = sl._plans[id(md.scheduler_metadata)]
    k = len(scheds)
    assert k >= 2 and [r[2] for r in runs] == [s[1] for s in scheds]  # every slice once, in order
    assert [s[2] for s in scheds] == [True] + [False] * (k - 1)  # only the first slice carries the reductions
    assert checks == [(1, j / k) for j in range(1, k)]  # between slices, never before the first
    assert [c[1] for c in seam.calls if c[0] == "reset"] == [s[1] for s in scheds]
    assert sl.sliced_calls == 1
    # every query row exactly once, cut at tile multiples
    rows = sorted((it[1], it[1] + it[2]) for s in scheds for t in s[1] for it in t)
    assert rows[0][0] == 0 and rows[-1][1] == n and all(a[1] == b[0] for a, b in zip(rows, rows[1:]))
    assert all(a % tile == 0 for a, _ in rows)
    fwd(orig, "L", "q", "k", "v", "kv", md, output="OUT", extra=1)  # the next layer of the same step: plan reused
    assert seam.parsed == 1 and sl.sliced_calls == 2
    sl.disarm(undo)
    assert sl._plans == {} and sl.check is None and all(m.wrapped is None for ly in sl.attn for m in ly)


def test_slice_count_follows_the_rows_of_the_armed_step(monkeypatch):
    sl, _, _ = _slicer(monkeypatch, slice_tokens=1024)
    tile = sl.verdict["tile_rows"]
    n = 8 * tile
    counts = {}
    for rows in (n // 2, n // 8):
        undo = sl.arm(lambda *a: None, rows=rows)
        md = _md(n, [n])
        calls = []
        out = sl._forward_for(0)(lambda *a, **k: calls.append(a), "L", "q", "k", "v", "kv", md, output="OUT")
        counts[rows] = len(sl._plans[id(md.scheduler_metadata)])
        assert out == "OUT" and len(calls) == counts[rows]  # two slices are already a sliced call
        sl.disarm(undo)
    # the plan balances causal work (later rows attend to more keys), so a slice that would hold less than half a
    # tile's work is merged away: at most the requested count, and more slices for fewer rows per slice
    assert counts[n // 2] == 2 and 2 < counts[n // 8] <= 8, counts
    sl.arm(lambda *a: None)  # no rows: the static slice size
    assert sl._rows == 1024


@pytest.mark.parametrize("case", ["unsliceable", "one-slice"])
def test_a_call_that_cannot_be_split_runs_once_without_a_safe_point(monkeypatch, case):
    sl, seam, _ = _slicer(monkeypatch)
    checks, runs = [], []
    undo = sl.arm(lambda layer, f: checks.append((layer, f)), rows=1024)
    if case == "unsliceable":
        seam.can_slice = False
        md = _md(8192, [8192])
    else:  # decode rows only: every item is a single row, kept whole in the first slice
        md = _md(3, [1, 1, 1])

    def orig(*args, output=None, **kw):
        runs.append((args, output, kw))
        return "orig-return"

    out = sl.attn[0][0].wrapped(orig, "L", "q", "k", "v", "kv", md, output="OUT", extra=1)
    assert out == "orig-return" and runs == [(("L", "q", "k", "v", "kv", md), "OUT", {"extra": 1})]
    assert seam.sliceable_seen == [md]
    assert checks == [] and sl.sliced_calls == 0 and not [c for c in seam.calls if c[0] == "reset"]
    sl.disarm(undo)


def test_active_needs_an_exact_verdict_the_switch_and_the_step_size(monkeypatch):
    sl, _, _ = _slicer(monkeypatch, min_tokens=8192)
    assert sl.active(8192) and not sl.active(8191)
    assert sl.active(2048, 2048) and not sl.active(2047, 2048)  # the density tier's step size overrides
    sl.enabled = False
    assert not sl.active(10 ** 6)
    bad, _, _ = _slicer(monkeypatch, exact_tiles=())
    assert bad.active(10 ** 6) is False
    bad.verdict = {}  # no verdict at all: never active
    assert bad.active(10 ** 6) is False


def test_verdict_takes_the_first_exact_tile_and_says_why_when_none(monkeypatch, caplog):
    seam = FakeWorkerSeam()
    monkeypatch.setattr(slicing, "_l2_bytes", lambda: 2 * 1024 * 1024)
    tiles = slicing.q_tile_candidates(INFO, 2)
    assert len(tiles) >= 2
    with caplog.at_level(logging.WARNING, logger="retire.slicing"):
        sl, _, checked = _slicer(monkeypatch, seam, exact_tiles={tiles[1]})
    assert caplog.text == ""  # an exact verdict warns nothing
    v = sl.verdict
    assert v["exact"] and v["tile_rows"] == tiles[1] and checked == tiles[:2] and v["candidates"] == tiles
    assert {k: v[k] for k in INFO} == INFO and v["dtype"] == "torch.bfloat16"  # the kernel's info is reported
    first = sl.attn[0][0]
    assert seam.calls[0][1] is first and seam.calls[1] == ("prepare", "vec")  # the first layer's module
    assert seam.calls[2] == ("layout", seam.info, torch.bfloat16, torch.get_num_threads())
    assert sl.min_tokens == 8192 and sl.slice_tokens == 1024 == sl._rows and sl.check is None  # the static tier
    with caplog.at_level(logging.WARNING, logger="retire.slicing"):
        none, _, checked = _slicer(monkeypatch, FakeWorkerSeam(), exact_tiles=())
    assert not none.verdict["exact"] and not none.active(10 ** 6)
    assert checked == tiles and "differs by up to 0.5" in none.verdict["reason"]
    assert caplog.messages == ["retire: sliced attention is not bit-identical on this kernel (differs by up to 0.5); "
                               "layer-boundary safe points"]


@pytest.mark.parametrize("case,reason", [
    ("no-modules", "no CPU_ATTN attention modules"),
    ("unknown-isa", "q-tile size of ISA 'neon' unknown"),
    ("not-runnable", "kernel not runnable here: no AMX permission"),
    ("layout", "scheduler-metadata layout: 3 threads"),
])
def test_verdict_refuses_to_slice_and_names_the_reason(monkeypatch, case, reason):
    seam = FakeWorkerSeam(dict(INFO, isa="neon") if case == "unknown-isa" else None,
                          prepare="no AMX permission" if case == "not-runnable" else None,
                          layout="3 threads" if case == "layout" else None)
    monkeypatch.setattr(slicing.adapter, "worker", lambda: seam)
    monkeypatch.setattr(slicing, "selfcheck", lambda *a, **k: pytest.fail("self-check run after a refusal"))
    layers = [SimpleNamespace(attn=[])] if case == "no-modules" else _layers()
    v = AttentionSlicer(object(), layers).verdict
    assert v["exact"] is False and v["reason"].startswith(reason), v
    if case != "no-modules":  # what was learnt of the kernel before the refusal is reported with it
        assert v["isa"] == seam.info["isa"] and v["dtype"] == "torch.bfloat16", v
    assert not AttentionSlicer(object(), layers).active(10 ** 6)


# ---------------------------------------------------------------------- control (worker RPC)
class FakeSplitter:
    def __init__(self):
        self.enabled, self.min_tokens, self.rows, self.split_calls = True, 8192, 1024, 0
        self.verdict = {"exact": True}
        self.verdicts = {1024: {"exact": True}}

    def set_rows(self, rows):
        self.rows = rows
        self.verdicts.setdefault(rows, {"exact": True})
        return self.verdicts[rows]

    def verdict_for(self, rows):
        return self.verdicts.setdefault(rows, {"exact": rows % 2 == 0})


def _worker(monkeypatch):
    from retire.safepoints import SafePoints

    sl, _, _ = _slicer(monkeypatch, slice_tokens=1024)
    sp = SimpleNamespace(slicer=sl, splitter=FakeSplitter(), density=Density(), tiers={"static": 3, "fine": 1},
                         slice_min_tokens=8192)
    sp.set_density = lambda d: SafePoints.set_density(sp, d)
    return SimpleNamespace(_retire_step=SimpleNamespace(safe_points=sp)), sp


def _state(sp):
    sl, m = sp.slicer, sp.splitter
    return (sl.enabled, sl.min_tokens, sl.slice_tokens, m.enabled, m.min_tokens, m.rows, sp.density)


def test_control_applies_to_both_parts_and_reports(monkeypatch):
    w, sp = _worker(monkeypatch)
    out = slicing.control(w, False, min_tokens=2048, rows=512, window_s=5, fine=(1024, 256))
    assert _state(sp) == (False, 2048, 512, False, 2048, 512, Density(window_s=5.0, fine=(1024, 256)))
    assert out["installed"] and out["enabled"] is False and out["min_tokens"] == 2048 and out["slice_tokens"] == 512
    assert out["density"] == {"window_s": 5.0, "fine_min_tokens": 1024, "fine_rows": 256,
                              "tiers": {"static": 3, "fine": 1}}
    assert out["mlp"]["rows"] == 512 and out["mlp"]["min_tokens"] == 2048 and out["mlp"]["enabled"] is False
    assert out["mlp"]["fine_verdict"] == {"exact": True}  # fine rows min(256, 512) = 256
    assert out["verdict"] is sp.slicer.verdict
    assert out["sliced_calls"] == 0 and out["mlp"]["split_calls"] == 0 and out["mlp"]["verdict"] == {"exact": True}
    before = _state(sp)
    assert slicing.control(w)["enabled"] is False and _state(sp) == before  # a report changes nothing
    out = slicing.control(w, True, min_tokens=1, rows=1)  # the smallest values are accepted
    assert _state(sp)[:6] == (True, 1, 1, True, 1, 1) and out["enabled"] is True


@pytest.mark.parametrize("kw", [dict(rows=0), dict(min_tokens=0), dict(window_s=-1), dict(fine=(0, 512)),
                                dict(min_tokens=4096, rows=0), dict(rows=256, window_s=-1)])
def test_control_refused_changes_nothing(monkeypatch, kw):
    w, sp = _worker(monkeypatch)
    before = _state(sp)
    with pytest.raises(ValueError, match=r"must be >= 1|window|tier"):
        slicing.control(w, False, **kw)
    assert _state(sp) == before


def test_control_without_safe_points_reports_not_installed():
    assert slicing.control(SimpleNamespace()) == {"installed": False}
    assert slicing.control(SimpleNamespace(_retire_step=SimpleNamespace(safe_points=None))) == {"installed": False}


def test_control_without_an_mlp_splitter(monkeypatch):
    w, sp = _worker(monkeypatch)
    sp.splitter = None
    out = slicing.control(w, rows=256, min_tokens=4096)
    assert "mlp" not in out and (sp.slicer.slice_tokens, sp.slicer.min_tokens) == (256, 4096)


# ---------------------------------------------------------------------- logits probe (worker RPC)
def test_logits_probe_records_digests_in_order_and_detaches(monkeypatch):
    import hashlib

    hooks = []

    class Seam:
        def observe_logits(self, worker, record):
            hooks.append(record)
            return lambda: hooks.remove(record)

    monkeypatch.setattr(slicing.adapter, "worker", lambda: Seam())
    w = SimpleNamespace()
    seen = []
    Seam.observe_logits = lambda self, worker, record: (seen.append(worker), hooks.append(record),
                                                       lambda: hooks.remove(record))[2]
    assert slicing.logits_probe(w, False) == []  # stop before start: nothing recorded, nothing to undo
    assert slicing.logits_probe(w, True) == [] and len(hooks) == 1 and seen == [w]
    a, b = torch.arange(6, dtype=torch.bfloat16).view(2, 3), torch.ones(4)
    hooks[0](a)
    hooks[0](b.t())
    want = [hashlib.sha256(t.float().numpy().tobytes()).hexdigest() for t in (a, b)]
    assert slicing.logits_probe(w, False) == want and hooks == []
    assert slicing.logits_probe(w, False) == []  # stopped: a second stop returns nothing


# ---------------------------------------------------------------------- the L2 size the q-tile is read from
@pytest.mark.parametrize("size,want", [("2048K", 2 * 1024 ** 2), ("2M", 2 * 1024 ** 2), ("1048576", 1048576)])
def test_l2_bytes_reads_the_level_2_cache_size(monkeypatch, tmp_path, size, want):
    for i, (level, sz) in enumerate([("1", "48K"), ("1", "32K"), ("2", size), ("3", "105M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(level + "\n")
        (d / "size").write_text(sz + "\n")
    import glob
    monkeypatch.setattr(glob, "glob", lambda pat: [str(p) for p in reversed(sorted(tmp_path.iterdir()))])
    assert slicing._l2_bytes() == want


def test_l2_bytes_skips_unreadable_entries_and_defaults_to_256k(monkeypatch, tmp_path):
    import glob
    bad = tmp_path / "index0"
    bad.mkdir()
    (bad / "level").write_text("2\n")
    (bad / "size").write_text("lots\n")  # unparsable: skipped
    missing = tmp_path / "index1"          # no files: skipped
    missing.mkdir()
    monkeypatch.setattr(glob, "glob", lambda pat: [str(bad), str(missing)])
    assert slicing._l2_bytes() == 256 * 1024
    monkeypatch.setattr(glob, "glob", lambda pat: [])
    assert slicing._l2_bytes() == 256 * 1024
    good = tmp_path / "index2"
    good.mkdir()
    (good / "level").write_text("2\n")
    (good / "size").write_text("1M\n")
    monkeypatch.setattr(glob, "glob", lambda pat: [str(bad), str(missing), str(good)])
    assert slicing._l2_bytes() == 1024 ** 2  # the entries it cannot read are passed over, not the end of the search


def test_q_tile_candidates_are_whole_rows_and_never_zero(monkeypatch):
    """Many q heads per KV head and a tiny cache: the per-KV-head tile rounds down (64 / 4 = 16 heads per KV head;
    8 // 16 = 0 is dropped, 16 // 16 = 1 row is kept), and every candidate is an int (a row count the plan cuts
    at), also when the heads do not divide (8 / 3)."""
    monkeypatch.setattr(slicing, "_l2_bytes", lambda: 16 * 1024)
    got = slicing.q_tile_candidates(dict(INFO, num_heads=64, num_kv_heads=4), 2)
    assert got == [8, 16, 1] and all(type(t) is int for t in got)
    monkeypatch.setattr(slicing, "_l2_bytes", lambda: 2 * 1024 * 1024)
    got = slicing.q_tile_candidates(dict(INFO, num_heads=8, num_kv_heads=3), 2)
    assert all(type(t) is int for t in got) and got[1] == got[0] // 2, got


# ---------------------------------------------------------------------- the slice plan against a row-by-row reference
def _reference_plan(parsed, qsl, seqs, tile, n):
    """The plan's rule, written row by row: a piece is `tile` rows of an item (the last one shorter), its work the
    number of (query row, key) pairs the causal rows attend to; a thread's pieces go, in order, to the slice holding
    the midpoint of their work; consecutive pieces of one item in one slice are one item again. Single-row items,
    split-KV items and items not starting at key 0 stay whole in slice 0."""
    cu, items = parsed["cu"], parsed["items"]
    out = [[[] for _ in range(len(cu) - 1)] for _ in range(n)]
    for t in range(len(cu) - 1):
        pieces = []
        for it in items[cu[t]:cu[t + 1]]:
            r, qs, qn, lo, hi, _, sid, _ = it
            if qn <= 1 or sid >= 0 or lo != 0:
                out[0][t].append(list(it))
                continue
            pos0 = seqs[r] - (qsl[r + 1] - qsl[r]) + qs  # the key position of the item's first row
            for a in range(0, qn, tile):
                rows = range(a, min(a + tile, qn))
                pieces.append((it, rows, sum(pos0 + i + 1 for i in rows)))
        total, done = sum(p[2] for p in pieces), 0
        for it, rows, w in pieces:
            j = min(n - 1, int((done + w / 2) / total * n))
            done += w
            lst = out[j][t]
            if lst and lst[-1][0] == it[0] and lst[-1][6] < 0 and lst[-1][1] + lst[-1][2] == it[1] + rows[0]:
                lst[-1][2] += len(rows)
            else:
                lst.append([it[0], it[1] + rows[0], len(rows), it[3], it[4], w, it[6], it[7]])
    return [s for s in out if any(s)]


def _random_schedule(rng):
    """A kernel-shaped schedule: requests with a cached context, each request's rows cut into items over 1-3
    threads, some single-row items, and some requests whose first 1-3 rows are split over the KV (two items, split
    ids 0 and 1, in either order: a split item with id 0 and key range from 0 is split all the same)."""
    n_req = rng.randint(1, 3)
    qlens = [rng.randint(1, 40) for _ in range(n_req)]
    ctx = [rng.choice([0, 0, 5, 33]) for _ in range(n_req)]
    qsl = [0]
    for q in qlens:
        qsl.append(qsl[-1] + q)
    seqs = [c + q for c, q in zip(ctx, qlens)]
    items = []
    for r, q in enumerate(qlens):
        start = 0
        if rng.random() < 0.3:  # the request's first rows split over the KV: two split items (ids 0 and 1)
            k, half = min(q, rng.randint(1, 3)), seqs[r] // 2
            pair = [[r, 0, k, 0, half, 7, 0, 3], [r, 0, k, half, seqs[r], 7, 1, 3]]
            items += pair if rng.random() < 0.5 else pair[::-1]
            start = k
        while start < q:
            qn = min(q - start, rng.randint(1, 25))
            items.append([r, start, qn, 0, seqs[r], 7, -1, 3])
            start += qn
    threads = rng.randint(1, 3)
    cuts = sorted(rng.sample(range(1, len(items)), min(threads - 1, len(items) - 1))) if len(items) > 1 else []
    return {"cu": [0, *cuts, len(items)], "items": items}, qsl, seqs


def test_slice_plan_equals_the_row_by_row_reference():
    """Random kernel-shaped schedules (1-3 requests with contexts, 1-3 threads, single-row and split-KV items), every
    tile from 1 row, 2-5 slices: the plan equals the reference exactly, field by field (the stored work is the first
    piece's, in (query row, key) pairs). Plus the invariants the kernel relies on, checked on the plan itself: each
    thread's rows exactly once, whole items unchanged in slice 0, a thread's pieces in slice order."""
    import random

    rng = random.Random(5)
    for case in range(300):
        parsed, qsl, seqs = _random_schedule(rng)
        tile, n = rng.randint(1, 9), rng.randint(2, 5)
        got = slicing.plan(parsed, qsl, seqs, tile, n)
        assert got == _reference_plan(parsed, qsl, seqs, tile, n), (case, parsed, qsl, seqs, tile, n)
        cu, items = parsed["cu"], parsed["items"]
        for t in range(len(cu) - 1):
            mine = [(j, it) for j, s in enumerate(got) for it in s[t]]
            rows = sorted((it[0], it[1] + k) for _, it in mine if it[6] < 0 for k in range(it[2]))
            want = sorted((it[0], it[1] + k) for it in items[cu[t]:cu[t + 1]] if it[6] < 0 for k in range(it[2]))
            assert rows == want, (case, t)
            assert all(j == 0 for j, it in mine if it[6] >= 0)
            order = [j for j, it in mine if it[6] < 0 and it[2] > 0]
            assert order == sorted(order)


def test_slice_plan_work_counts_attended_keys_after_a_context():
    """One request of 6 rows after a 10-token context, tile 2, 3 slices: pieces of 2 rows attend to 11+12, 13+14 and
    15+16 keys (work 23, 27, 31; total 81), so their midpoints 11.5, 36.5 and 65.5 fall in slices 0, 1 and 2."""
    parsed = {"cu": [0, 1], "items": [[0, 0, 6, 0, 16, 0, -1, 0]]}
    assert slicing.plan(parsed, [0, 6], [16], 2, 3) == [[[[0, 0, 2, 0, 16, 23, -1, 0]]],
                                                        [[[0, 2, 2, 0, 16, 27, -1, 0]]],
                                                        [[[0, 4, 2, 0, 16, 31, -1, 0]]]]
    # the same rows with no context: 3, 7, 11 (total 21): midpoints 1.5, 6.5, 15.5 -> slices 0, 0, 2
    assert slicing.plan(parsed, [0, 6], [6], 2, 3) == [[[[0, 0, 4, 0, 16, 3, -1, 0]]],
                                                       [[[0, 4, 2, 0, 16, 11, -1, 0]]]]
