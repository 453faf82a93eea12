"""Pure checks of the safe-point cost model and the mailbox (no engine)."""
from retire.mailbox import Mailbox, create_path, key
from retire.safepoints import decide


def test_obsolete_chunk_is_cut_and_shared_chunk_finishes():
    # chunk [4096, 8192), 8 layers, 4 done in 2 s: 2 s remaining
    cut = decide(chunk=(4096, 4096), lcp=1000, new_len=8000, block=32, elapsed=2.0, layers_done=4, layers=8)
    assert cut["cut"] and cut["predicted_successor_ready_cut"] < cut["predicted_successor_ready_finish"]
    fin = decide(chunk=(4096, 4096), lcp=8100, new_len=8200, block=32, elapsed=2.0, layers_done=4, layers=8)
    assert not fin["cut"]  # the whole chunk is shared: finishing gives the earlier successor


def test_late_in_a_mostly_useful_step_finishing_wins():
    # 7 of 8 layers done and 90% of the chunk is shared: recomputing it costs more than the last layer
    d = decide(chunk=(0, 4096), lcp=3700, new_len=4200, block=32, elapsed=7.0, layers_done=7, layers=8)
    assert not d["cut"]
    # early in the same step, cutting wins
    d = decide(chunk=(0, 4096), lcp=600, new_len=4200, block=32, elapsed=1.0, layers_done=1, layers=8)
    assert d["cut"]


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
