"""The revocation mailbox engine-free (retire/mailbox.py): the shared-memory table the frontend, EngineCore and the
workers map, exercised in this process through two mappings of one real file (as two processes map it).

Invariants checked: entries are keyed by a 16-byte digest of the whole request id; a full mailbox refuses a post
(and a cleared slot is reused); a torn (odd-sequence) slot is never returned to a reader; the pause barrier holds a
worker only at its armed layer and, when armed for one request, only in a step that runs that request, and lets it
go on release; the counters and the decision log round-trip, a log longer than its area is cut, a log that is not
JSON reads as none. The worker side runs on a thread, synchronized on the mailbox's own words and an Event (no
sleeps).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import struct
import threading

import pytest

from retire import mailbox as mbmod
from retire.mailbox import HDR, LOG, SLOT, SLOTS, Mailbox, create_path, key


@pytest.fixture()
def mb():
    m = Mailbox(create_path())
    yield m
    m.unlink()


def test_key_is_the_first_16_bytes_of_sha256_and_a_header_word_is_never_zero():
    rid = "retire-" + "é/#" * 400
    assert key(rid) == hashlib.sha256(rid.encode()).digest()[:16] and len(key(rid)) == 16
    assert mbmod._word(key(rid)) == struct.unpack_from("<q", key(rid))[0] != 0
    assert mbmod._word(bytes(16)) == 1  # an all-zero prefix would read as "no filter"


def test_a_full_mailbox_refuses_a_post_and_a_cleared_slot_is_reused(mb):
    for i in range(SLOTS):
        mb.post(f"r{i}", i, i + 1)
    with pytest.raises(RuntimeError, match=r"^revocation mailbox full \(256 revocations in flight\)$"):
        mb.post("one-more", 1, 2)
    assert len(mb.revoked()) == SLOTS and mb.revoked()[key("r255")] == (255, 256)
    assert mb.clear("r7") and not mb.is_posted("r7") and not mb.clear("never-posted")
    mb.post("late", 3, 4)  # takes the freed slot
    assert mb.revoked()[key("late")] == (3, 4) and len(mb.revoked()) == SLOTS
    assert struct.unpack_from("<QQqq16s", mb.mm, HDR + 7 * SLOT)[4] == key("late")


def test_entries_are_seqlocked_and_live_flags_are_visible_to_any_mapping(mb):
    other = Mailbox(mb.path)
    try:
        assert not other.any_live() and other.revoked() == {}
        mb.post("a", 5, 9)
        assert other.any_live() and other.is_posted("a")
        assert struct.unpack_from("<Q", mb.mm, HDR)[0] == 2  # one write: sequence 0 -> 1 (writing) -> 2 (stable)
        struct.pack_into("<Q", mb.mm, HDR, 3)  # a writer caught mid-write (odd sequence): the slot is torn
        assert other._read(0) is None and other.revoked() == {}
        with pytest.raises(RuntimeError, match="revocation mailbox full"):  # a torn slot is never taken as free
            for i in range(SLOTS):
                other.post(f"x{i}", 1, 1)
        struct.pack_into("<Q", mb.mm, HDR, 4)
        assert other.revoked()[key("a")] == (5, 9)
        assert mb.clear("a") and struct.unpack_from("<Q", mb.mm, HDR)[0] == 6 and not other.is_posted("a")
        assert other.any_live()  # the x* posts are still live
    finally:
        other.close()


def test_any_live_reads_each_slots_live_word(mb):
    mb.post("a", 1, 2)
    mb.post("b", 1, 2)
    assert mb.clear("a") and mb.any_live()  # slot 1 still live
    assert mb.clear("b") and not mb.any_live()
    for i in range(SLOTS):
        mb.post(f"r{i}", 1, 2)
    for i in range(SLOTS - 1):
        assert mb.clear(f"r{i}")
    assert mb.any_live() and mb.revoked() == {key(f"r{SLOTS - 1}"): (1, 2)}  # only the last slot is live
    assert mb.clear(f"r{SLOTS - 1}") and not mb.any_live()


def test_a_revocation_with_no_shared_prefix_is_cleared_and_a_cleared_slot_is_zeroed(mb):
    mb.post("r", 0, 5)  # lcp 0: nothing shared, still a live revocation
    assert mb.revoked() == {key("r"): (0, 5)} and mb.clear("r") and not mb.is_posted("r")
    seq, live, lcp, new_len, kb = struct.unpack_from("<QQqq16s", mb.mm, HDR)
    assert (seq, live, lcp, new_len, kb) == (4, 0, 0, 0, bytes(16))  # nothing of the revoked request remains


def test_mailbox_files_are_named_for_what_they_are():
    import os
    path = create_path()
    try:
        assert os.path.basename(path).startswith(f"retire-mailbox-{os.getpid()}-")
        assert os.path.getsize(path) == mbmod.SIZE
    finally:
        os.unlink(path)


def test_counters_and_the_decision_log(mb):
    assert mb.count("cuts") == 0 and mb.count("checks") == 0
    mb.bump("cuts")
    mb.bump("checks", 3)
    mb.bump("checks")
    assert mb.count("cuts") == 1 and mb.count("checks") == 4
    assert mb.read_log() is None
    mb.write_log(json.dumps({"path": "finish-step", "req_ids": ["r"]}))
    assert Mailbox(mb.path).read_log() == {"path": "finish-step", "req_ids": ["r"]}
    mb.clear_log()
    off = HDR + SLOTS * SLOT
    assert mb.read_log() is None and struct.unpack_from("<q", mb.mm, off)[0] == 0  # the length word is cleared
    mb.write_log("x" * (2 * LOG))  # longer than the log area: cut at LOG - 8 bytes, no longer JSON
    assert struct.unpack_from("<q", mb.mm, off)[0] == LOG - 8 and mb.read_log() is None
    mb.write_log(json.dumps({"n": 1}))  # a shorter log after a longer one reads only its own bytes
    assert mb.read_log() == {"n": 1}


def _worker(mb: Mailbox, layer: int, keys, done: threading.Event):
    def run():
        mb.worker_pause_point(layer, keys)
        done.set()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_pause_holds_only_the_armed_layer_of_a_step_that_runs_the_armed_request(mb):
    mb.bump("cuts", 2)
    mb.arm_pause(2, "target")
    mb.worker_pause_point(1, [key("target")])  # another layer passes
    mb.worker_pause_point(2, [key("someone-else")])  # the armed layer of another request's step passes
    mb.worker_pause_point(2, [])
    assert not mb.paused()
    done = threading.Event()
    t = _worker(mb, 2, [key("x"), key("target")], done)
    asyncio.run(mb.wait_paused(timeout=10))  # the barrier: the worker is held at layer 2
    assert mb.paused() and not done.is_set()
    mb.worker_pause_point(2, [key("target")])  # the pause was taken: a second step passes
    mb.release()
    t.join(timeout=10)
    assert done.is_set() and not t.is_alive() and not mb.paused()
    assert mb._get(2) == 0 and mb.count("cuts") == 2  # the worker consumed the release; counters untouched
    mb.worker_pause_point(2, [key("target")])  # released and disarmed: passes


def test_pause_armed_without_a_request_holds_any_step_at_that_layer(mb):
    mb.arm_pause(0)
    done = threading.Event()
    t = _worker(mb, 0, [], done)
    asyncio.run(mb.wait_paused(timeout=10))
    assert not done.is_set()
    mb.release()
    t.join(timeout=10)
    assert done.is_set() and not mb.paused()


def test_rearming_clears_a_previous_release_and_pause(mb):
    mb.arm_pause(0)
    mb.release()  # released before any worker came: the next arm must hold again
    mb.arm_pause(1, "r")
    done = threading.Event()
    t = _worker(mb, 1, [key("r")], done)
    asyncio.run(mb.wait_paused(timeout=10))
    assert not done.is_set()
    mb.release()
    t.join(timeout=10)
    assert done.is_set()


def test_wait_paused_times_out_with_its_message(mb):
    mb.arm_pause(0)
    with pytest.raises(TimeoutError, match=r"^worker never reached the armed safe point$"):
        asyncio.run(mb.wait_paused(timeout=0.01))  # no worker: the bound is the fault under test
    assert not mb.paused()


def test_release_disarms_for_every_mapping(mb):
    """The control words are the protocol between processes: after `release()` no layer is armed and the release
    word is up, as another mapping (the worker's) reads them."""
    other = Mailbox(mb.path)
    try:
        mb.arm_pause(3, "r")
        assert other._get(0) == 4 and other._get(2) == 0 and other._get(5) == mbmod._word(key("r"))
        mb.release()  # released before any worker came
        assert other._get(0) == 0 and other._get(2) != 0 and not other.paused()
        other.worker_pause_point(3, [key("r")])  # passes: nothing is armed
        other.worker_pause_point(0, [key("r")])
    finally:
        other.close()


def test_a_taken_pause_disarms_even_at_layer_zero(mb):
    """The worker that takes the pause disarms it, so the next step (at any layer, 0 included) runs through."""
    mb.arm_pause(0)
    done, second = threading.Event(), threading.Event()
    t = _worker(mb, 0, [], done)
    try:
        asyncio.run(mb.wait_paused(timeout=10))
        t2 = _worker(mb, 0, [key("next")], second)
        t2.join(timeout=10)
        assert second.is_set() and not done.is_set()  # the next step passed while the first is still held
    finally:
        mb.release()
        t.join(timeout=10)
    assert done.is_set()


def test_a_stale_paused_word_does_not_satisfy_the_next_wait(mb):
    """A worker that died while held leaves the paused word up; re-arming clears it, so the frontend's barrier waits
    for a worker that really reaches the new pause."""
    mb._set(1, 1)  # the dead worker's word
    mb.arm_pause(1)
    assert not mb.paused()
    with pytest.raises(TimeoutError, match=r"^worker never reached the armed safe point$"):
        asyncio.run(mb.wait_paused(timeout=0.01))  # no worker comes: the bound is the fault under test


def test_wait_paused_waits_for_a_worker_that_arrives_after_the_wait_began(mb):
    """The worker reaches the armed layer only after the frontend's first look (gated on an Event set by that look),
    so the barrier must poll, within its bound, rather than give up or return early."""
    looked = threading.Event()

    class Watched(Mailbox):
        def paused(self):
            r = super().paused()
            looked.set()
            return r

    front = Watched(mb.path)
    mb.arm_pause(0)
    done = threading.Event()

    def run():
        looked.wait(10)
        mb.worker_pause_point(0, [])
        done.set()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        asyncio.run(front.wait_paused(timeout=10))
        assert mb.paused() and not done.is_set()
    finally:
        mb.release()
        t.join(timeout=10)
        front.close()
    assert done.is_set()


def test_move_pause_arms_the_new_layer_then_releases_and_returns_the_pause_count(mb):
    mb._set(6, 5)  # five pauses taken so far
    mb.arm_pause(1)
    assert mb.move_pause(3) == 5
    assert mb._get(0) == 4 and mb._get(2) == 1 and mb._get(6) == 5


def test_a_moved_pause_holds_the_same_step_again_at_the_later_layer(mb):
    """One worker step walks layers 0..4: held at layer 1, moved to layer 3 (the frontend waits past the pause
    count it had), held there with layers 0..2 done, then released to finish the step."""
    passed: list[int] = []
    done = threading.Event()

    def run():
        for layer in range(5):
            mb.worker_pause_point(layer, [])
            passed.append(layer)
        done.set()
    mb.arm_pause(1)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        asyncio.run(mb.wait_paused(timeout=10))
        assert passed == [0] and mb._get(6) == 1
        asyncio.run(mb.wait_pause_count(mb.move_pause(3), timeout=10))
        assert mb.paused() and passed == [0, 1, 2] and mb._get(6) == 2 and not done.is_set()
    finally:
        mb.release()
        t.join(timeout=10)
    assert done.is_set() and passed == [0, 1, 2, 3, 4] and not mb.paused()


def test_wait_pause_count_needs_both_a_new_pause_and_a_held_worker(mb):
    """A held worker whose pause is not past the count (the stale pause before the move), or a count past it with
    the worker no longer held, does not satisfy the barrier: it times out with its message."""
    mb._set(6, 1)
    mb._set(1, 1)  # held, but only the pause already counted
    with pytest.raises(TimeoutError, match=r"^worker never reached the moved safe point$"):
        asyncio.run(mb.wait_pause_count(1, timeout=0.01))  # no worker comes: the bound is the fault under test
    mb._set(6, 2)
    mb._set(1, 0)  # a new pause counted, but the worker is not held
    with pytest.raises(TimeoutError, match=r"^worker never reached the moved safe point$"):
        asyncio.run(mb.wait_pause_count(1, timeout=0.01))
    mb._set(1, 1)
    asyncio.run(mb.wait_pause_count(1, timeout=10))  # both: returns


def test_wait_pause_count_waits_for_a_worker_that_arrives_after_the_wait_began(mb):
    """The worker reaches the armed layer only after the frontend's first look at the pause count (gated on an Event
    set by that look), so the barrier must poll, within its bound, rather than give up or return early."""
    looked = threading.Event()

    class Watched(Mailbox):
        def _get(self, i):
            r = super()._get(i)
            if i == 6:
                looked.set()
            return r

    front = Watched(mb.path)
    mb.arm_pause(0)
    done = threading.Event()

    def run():
        looked.wait(10)
        mb.worker_pause_point(0, [])
        done.set()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        asyncio.run(front.wait_pause_count(0, timeout=10))
        assert mb.paused() and mb._get(6) == 1 and not done.is_set()
    finally:
        mb.release()
        t.join(timeout=10)
        front.close()
    assert done.is_set()


def test_wait_count_returns_the_worker_count_once_it_exceeds_the_mark_and_times_out_naming_it(mb):
    """`wait_count` (the barrier on the worker's `cuts`/`checks` counters): a count already above the mark returns
    it at once, one at the mark waits for a bump made after the frontend's first look (gated on an Event set by that
    look, as above), and one that never moves raises TimeoutError naming the counter, its value and the mark; the two
    counters are separate."""
    mb.bump("cuts", 3)
    assert asyncio.run(mb.wait_count("cuts", 2, timeout=10)) == 3
    looked = threading.Event()

    class Watched(Mailbox):
        def count(self, what):
            looked.set()
            return super().count(what)

    front = Watched(mb.path)

    def worker():
        looked.wait(10)
        mb.bump("checks", 2)
    t = threading.Thread(target=worker, daemon=True)
    t.start()
    try:
        assert asyncio.run(front.wait_count("checks", 1, timeout=10)) == 2
    finally:
        t.join(timeout=10)
    assert mb.count("cuts") == 3
    with pytest.raises(TimeoutError, match=r"^the worker's cuts count stayed at 3 \(waited for more than 3\)$"):
        asyncio.run(mb.wait_count("cuts", 3, timeout=0.01))  # no worker: the bound is the fault under test
