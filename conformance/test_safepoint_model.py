"""Pure checks of the safe-point cost model, the attention slice planner and the mailbox (no engine)."""
import pytest

from retire.mailbox import Mailbox, create_path, key
from retire.safepoints import SafePoints, decide
from retire.slicing import plan


def test_obsolete_chunk_is_cut_and_shared_chunk_finishes():
    # chunk [4096, 8192), half the step done in 2 s: 2 s remaining
    cut = decide(chunk=(4096, 4096), lcp=1000, new_len=8000, block=32, elapsed=2.0, progress=0.5)
    assert cut["cut"] and cut["predicted_successor_ready_cut"] < cut["predicted_successor_ready_finish"]
    fin = decide(chunk=(4096, 4096), lcp=8100, new_len=8200, block=32, elapsed=2.0, progress=0.5)
    assert not fin["cut"]  # the whole chunk is shared: finishing gives the earlier successor


def test_late_in_a_mostly_useful_step_finishing_wins():
    # 7/8 of the step done and 90% of the chunk is shared: recomputing it costs more than the rest of the step
    d = decide(chunk=(0, 4096), lcp=3700, new_len=4200, block=32, elapsed=7.0, progress=7 / 8)
    assert not d["cut"]
    # early in the same step, cutting wins
    d = decide(chunk=(0, 4096), lcp=600, new_len=4200, block=32, elapsed=1.0, progress=1 / 8)
    assert d["cut"]


def test_the_first_safe_point_keeps_the_useful_work_rule():
    """Before any layer ran (progress 0, no measured time) a wholly shared chunk still finishes, an obsolete one is
    cut; the decision does not depend on the unknown time scale."""
    shared = decide(chunk=(0, 2048), lcp=2100, new_len=2300, block=32, elapsed=0.0, progress=0.0)
    assert not shared["cut"] and shared["units"] == "step"
    assert decide(chunk=(0, 2048), lcp=100, new_len=2300, block=32, elapsed=0.0, progress=0.0)["cut"]
    scaled = decide(chunk=(0, 2048), lcp=100, new_len=2300, block=32, elapsed=0.0, progress=0.0,
                    per_token_cost=1e-3)
    assert scaled["cut"] and scaled["units"] == "s" and scaled["predicted_successor_ready_finish"] > 2.0


def test_progress_grows_through_every_safe_point_of_the_first_layer():
    """Before any layer has completed, progress comes from the layer's assumed split (attention first, then the MLP):
    every safe point of layer 0 (its start, the attention slices, the MLP's start, the MLP slices) is further along
    than the one before it and short of layer 1's start. (An MLP slice once counted as the MLP's start.)"""
    sp = object.__new__(SafePoints)  # the safe points' own callbacks, no worker
    sp.layers, sp.armed, points = [None] * 8, {"decided": False}, []
    sp._point = lambda a, i, within, where: points.append((where, sp._progress({"layer_t": []}, i, within)))
    points.append(("layer", sp._progress({"layer_t": []}, 0, 0.0)))
    for f in (0.25, 0.5, 0.75):
        sp._slice_point(0, f)
    sp._mlp_hook(0)(None, ())
    for f in (0.25, 0.5, 0.75):
        sp._mlp_slice_point(0, f)
    progress = [p for _, p in points]
    assert len(points) == 8 and progress == sorted(set(progress)), points
    assert progress[0] == 0 and progress[-1] < 1 / 8, points


@pytest.mark.parametrize("innocent,progress,cut", [
    (1, 0.25, True),       # a decode bystander loses one token of work: cut
    (2000, 0.25, True),    # obsolete remainder 0.75 * 2096/4096 of the step > lost 0.25 * 2000/4096 + extra
    (2000, 0.55, False),   # later in the same step the innocents' lost work outweighs it: finish
    (3500, 0.30, False),   # a small obsolete chunk beside a large innocent one, a third in: finish
])
def test_mixed_step_cut_pays_only_when_the_obsolete_remainder_outweighs_the_innocents(innocent, progress, cut):
    n = 4096 - innocent  # the revoked chunk; LCP before it, so all of it is obsolete
    d = decide(chunk=(4096, n), lcp=500, new_len=4000, block=32, elapsed=progress * 4.0, progress=progress,
               step_tokens=4096, innocent_tokens=innocent)
    assert d["cut"] is cut, d
    # the receipt's terms: cut iff obsolete remainder > innocents' lost work (no extra recompute: LCP before chunk)
    assert (d["obsolete_remainder"] > d["innocent_lost_work"]) is cut


def _item(r, qs, qn, hi):
    return [r, qs, qn, 0, hi, 0, -1, 0]


def test_slice_plan_cuts_items_only_at_tile_multiples_and_keeps_split_items_whole():
    # two threads: thread 0 rows [0, 2896) of request 0, thread 1 rows [2896, 4096) + request 1's decode row (kv split)
    parsed = {"cu": [0, 1, 3], "items": [_item(0, 0, 2896, 4096), _item(0, 2896, 1200, 4096),
                                         [1, 0, 1, 0, 512, 512, 0, 0]]}
    slices = plan(parsed, [0, 4096, 4097], [4096, 1000], tile=648, n_slices=4)
    assert 2 <= len(slices) <= 4
    rows = {0: [], 1: []}
    for j, s in enumerate(slices):
        for t, items in enumerate(s):
            for it in items:
                if it[6] >= 0:
                    assert j == 0 and it == [1, 0, 1, 0, 512, 512, 0, 0]  # split item whole, first slice
                    continue
                start = 0 if t == 0 else 2896
                assert (it[1] - start) % 648 == 0, it  # every cut at a tile multiple from the item's start
                rows[t].append((it[1], it[1] + it[2]))
    for t, (lo, hi) in {0: (0, 2896), 1: (2896, 4096)}.items():  # each thread's rows exactly once, in order
        r = sorted(rows[t])
        assert r[0][0] == lo and r[-1][1] == hi and all(a[1] == b[0] for a, b in zip(r, r[1:]))


@pytest.mark.parametrize("heads,kv_heads", [(8, 4), (4, 2)])  # the `long` and `unit` models' attention shapes
def test_sliced_kernel_is_bit_identical_and_the_selfcheck_catches_a_changed_split(heads, kv_heads):
    """The CPU attention kernel of this build, on random data: the step's work items cut at the q-tile size give the
    unsliced output exactly (`torch.equal`). Negative controls, through the self-check's `alter` seam: a sliced run
    that leaves its last slice out, and one whose query differs from the unsliced run's by one ulp in one element,
    are both reported inexact (the second is the size of difference a misaligned tile produces). A split cut 8 rows
    off the tile is NOT a control on every CPU: on a Xeon without AVX512-BF16 (2026-12-02) every bf16 split was
    exact, down to 1-row tiles, while fp32 splits off the tile differed by 3.7e-7; the self-check judges the split
    the engine will run, so either way only an exact one arms. On "amx" (Intel AMX, 2026-12-05) a split at half the
    kernel's tile is a control: it leaves smaller q tiles than the kernel's, and the self-check reports it inexact.
    For an ISA whose q-tile the slicer does not know it checks that the slicer offers no tile, so it never arms."""
    import torch

    from retire import adapter
    from retire.slicing import q_tile_candidates, selfcheck

    wk = adapter.worker()
    dtype = torch.bfloat16
    info = {"isa": wk.kernel_isa(dtype, 32, 64), "head_dim": 64, "num_heads": heads, "num_kv_heads": kv_heads,
            "kv_cache_dtype": "auto", "sliding_window": -1, "split_kv": True}
    if info["isa"] not in ("vec", "amx"):  # the slicer knows no q-tile, never arms, and the engine's safe points
        # stay at the layer boundary (the engine test checks that fallback)
        assert q_tile_candidates(info, 2) == [], info
        return
    assert wk.prepare_isa(info["isa"]) is None
    assert wk.metadata_layout_ok(info, dtype, torch.get_num_threads()) is None
    tiles = q_tile_candidates(info, 2)
    good = next((t for t in tiles if selfcheck(wk, info, dtype, t)["exact"]), None)
    assert good is not None, f"no candidate tile gives a bit-identical split on {info['isa']}: {tiles}"
    r = selfcheck(wk, info, dtype, good)
    assert r["exact"] and r["max_abs_diff"] == 0.0 and r["slices"] >= 3 and r["reason"] is None, r
    dropped = selfcheck(wk, info, dtype, good, alter=lambda sl, q: (sl[:-1], q))
    assert not dropped["exact"] and dropped["max_abs_diff"] == float("inf"), dropped
    assert dropped["reason"] == "sliced kernel differs from the unsliced one by up to inf", dropped

    def one_ulp(sl, q):  # the next representable value of one element, in the query's own dtype (its bits + 1)
        bits = q.view({2: torch.int16, 4: torch.int32}[q.element_size()]).view(-1)
        bits[bits.numel() // 2] += 1
        return sl, q

    nudged = selfcheck(wk, info, dtype, good, alter=one_ulp)
    assert not nudged["exact"] and 0 < nudged["max_abs_diff"] < float("inf"), nudged
    # reproducible: the random data is drawn from the seed alone, so the same check reports the same difference
    assert selfcheck(wk, info, dtype, good, alter=one_ulp) == nudged
    if info["isa"] == "amx":  # the AMX kernel's tile is not divided per KV head: half of it is off the tile
        off = selfcheck(wk, info, dtype, good // 2)
        assert not off["exact"] and 0 < off["max_abs_diff"] < float("inf"), off


def test_q_tile_candidates_follow_each_isa_kernel_constants(monkeypatch):
    """The candidate q-tiles at a 2 MiB L2 (the kernel budgets half of it), for the `long` model's attention shape:
    "vec" offers its tile at 8 and 16 q heads per iteration and each per KV head, most likely first; "amx" offers
    exactly one tile, bf16 only, not divided per KV head (1344: cuts at 672 were measured inexact on AMX); an ISA
    whose constants the slicer does not know gets none, so it never arms."""
    from retire import slicing

    monkeypatch.setattr(slicing, "_l2_bytes", lambda: 2 * 1024 * 1024)
    shape = {"head_dim": 64, "num_heads": 8, "num_kv_heads": 4}
    assert slicing.q_tile_candidates(dict(shape, isa="amx"), 2) == [1344]
    assert slicing.q_tile_candidates(dict(shape, isa="amx", head_dim=128), 2) == [736]
    assert slicing.q_tile_candidates(dict(shape, isa="amx"), 4) == []  # the AMX kernel is bf16 only
    assert slicing.q_tile_candidates(dict(shape, isa="vec"), 2) == [1024, 512, 1248, 624]
    assert slicing.q_tile_candidates(dict(shape, isa="vec", num_kv_heads=8), 2) == [1024, 1248]
    for isa in ("neon", "vec16", None):
        assert slicing.q_tile_candidates(dict(shape, isa=isa), 2) == []
    monkeypatch.setattr(slicing, "_l2_bytes", lambda: 64 * 1024)  # a tiny cache: never below one q-head group
    assert slicing.q_tile_candidates(dict(shape, isa="amx"), 2) == [32]
    monkeypatch.setattr(slicing, "_l2_bytes", lambda: 64 * 1024 * 1024)  # a huge cache: capped at 128 groups
    assert slicing.q_tile_candidates(dict(shape, isa="amx"), 2) == [4096]


def test_prepare_isa_requests_amx_only_and_names_what_is_missing(monkeypatch):
    """The self-check runs the "amx" kernel only after the process has the AMX tile state; a refusal, or a torch
    without the request, is a reason (the slicer then keeps layer-boundary safe points), never a crash."""
    import torch

    from retire import adapter

    wk = adapter.worker()
    calls = []
    monkeypatch.setattr(torch._C._cpu, "_init_amx", lambda: calls.append(1) or True, raising=False)
    assert wk.prepare_isa("vec") is None and calls == []
    assert wk.prepare_isa("amx") is None and calls == [1]
    monkeypatch.setattr(torch._C._cpu, "_init_amx", lambda: False)
    assert "refused" in wk.prepare_isa("amx")
    monkeypatch.delattr(torch._C._cpu, "_init_amx")
    assert "_init_amx is missing" in wk.prepare_isa("amx")


def test_mailbox_round_trip_and_clear():
    mb = Mailbox(create_path())
    try:
        mb.post("req-1", 4096, 8000)
        mb.post("req-2", 12, 40)
        assert mb.revoked() == {key("req-1"): (4096, 8000), key("req-2"): (12, 40)}
        assert mb.clear("req-1") and not mb.clear("req-1")
        assert mb.revoked() == {key("req-2"): (12, 40)}
        other = Mailbox(mb.path)  # another process maps the same file
        assert other.revoked() == {key("req-2"): (12, 40)}
        other.close()
    finally:
        mb.unlink()


def test_mailbox_keys_are_digests_of_the_whole_id():
    """Long request ids that share a 96-byte prefix (the old truncation) stay distinct entries; a refusal-free
    round trip of 1,000-character ids."""
    mb = Mailbox(create_path())
    try:
        base = "retire-" + "s/#ü" * 250
        a, b = base + "-epoch-1-aaaa", base + "-epoch-2-bbbb"
        mb.post(a, 64, 100)
        assert mb.is_posted(a) and not mb.is_posted(b)
        mb.post(b, 32, 50)
        assert mb.revoked() == {key(a): (64, 100), key(b): (32, 50)}
        assert mb.clear(a) and mb.is_posted(b) and not mb.is_posted(a)
    finally:
        mb.unlink()


# A decode row with a long context beside a short chunk: with two threads the CPU kernel splits the decode row's KV
# (two split items and one reduction) while the chunk's rows land in a later slice. (Not in the engine's install-time
# self-check: the sliced steps it guards have 2,048+ rows, for which the kernel was not seen to split the KV.)
SPLIT_KV_SHAPE = ((1, 300), (40000, 0))


@pytest.mark.timeout(60, method="thread")  # a kernel spin ignores SIGALRM: the thread method still ends it
def test_split_kv_reductions_run_with_the_first_slice():
    """Where the kernel splits a row's KV, the sliced run must still reduce it: the split items and the reductions
    both run in slice 0, and the result equals the unsliced run. Negative control: reductions moved out of the first
    slice (built with every slice but the first) are reported inexact. On a host whose kernel splits no KV for these
    shapes there are no reductions to move, and the test checks exactly that (`n_red == 0`)."""
    import torch

    from retire import adapter
    from retire.slicing import q_tile_candidates, selfcheck

    wk = adapter.worker()
    dtype = torch.bfloat16
    info = {"isa": wk.kernel_isa(dtype, 32, 64), "head_dim": 64, "num_heads": 8, "num_kv_heads": 4,
            "kv_cache_dtype": "auto", "sliding_window": -1, "split_kv": True}
    if info["isa"] not in ("vec", "amx"):
        assert q_tile_candidates(info, 2) == []
        return
    assert wk.prepare_isa(info["isa"]) is None
    tile = q_tile_candidates(info, 2)[0]
    shape = SPLIT_KV_SHAPE
    qlens, ctx = shape
    qsl = torch.tensor([0, qlens[0], sum(qlens)], dtype=torch.int32)
    seqs = torch.tensor([c + q for c, q in zip(ctx, qlens)], dtype=torch.int32)
    parsed = wk.parse_schedule(wk.schedule_for(qsl, seqs, info, dtype))
    if parsed["n_red"] == 0:  # this kernel (thread count, ISA) does not split the KV here: nothing to reduce
        assert not [it for it in parsed["items"] if it[6] >= 0], parsed["items"]
        return
    r = selfcheck(wk, info, dtype, tile, shapes=(shape,))
    assert r["exact"] and r["slices"] >= 2, r

    class Unreduced:  # every slice built without the step's reductions
        def __getattr__(self, name):
            return getattr(wk, name)

        def build_schedule(self, parsed, s, first):
            return wk.build_schedule(parsed, s, False)

    bad = selfcheck(Unreduced(), info, dtype, tile, shapes=(shape,))
    assert not bad["exact"] and bad["max_abs_diff"] == float("inf"), bad
