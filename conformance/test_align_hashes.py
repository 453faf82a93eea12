"""ALIGN's LCP by vLLM's chained prefix-cache hashes (retire/align.py `chained_prefix_count`, retire/transition.py).

Invariant under test: the LCP ALIGN certifies from is the tokens' own longest common prefix whatever the hashes say
about how much of it was proved by hash: equal chained sha256 block hashes stand for equal tokens (O(log blocks)
compares), and only the tokens after the last equal hash are compared. The oracle is computed here from the token
lists alone, never through the code under test. Under a hash the port does not trust (xxhash), no token is taken as
proved (the negative control: the same case must then prove nothing by hash).
"""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from conformance.fixtures.enginefree import EngineFreeCore
from conformance.fixtures.prompts import tokens
from retire.align import STRIDE_CAP, chained_prefix_count, common_prefix_len

BS = 32


def _lcp(a, b) -> int:  # the oracle: element by element, no slices
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _chain(toks: list[int], bs: int = 4) -> list[bytes]:
    """Chained hashes as vLLM builds them (entry i covers tokens [0, (i+1) * bs)), with vLLM's own functions."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash

    init_none_hash(sha256)
    out, prev = [], None
    for i in range(len(toks) // bs):
        prev = hash_block_tokens(sha256, prev, toks[i * bs:(i + 1) * bs])
        out.append(prev)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=60), st.lists(st.integers(0, 3), max_size=30),
       st.lists(st.integers(0, 3), max_size=30))
def test_chained_prefix_count_is_the_number_of_whole_blocks_of_the_lcp(common, tail_a, tail_b):
    a, b = common + tail_a, common + tail_b
    ha, hb = _chain(a), _chain(b)
    assert chained_prefix_count(ha, hb) == min(_lcp(a, b) // 4, len(ha), len(hb))
    assert chained_prefix_count(hb, ha) == chained_prefix_count(ha, hb)


def test_chained_prefix_count_binary_search_finds_every_boundary():
    """On monotone lists (equal up to k, different after), every k from 0 to n, both lengths."""
    for n in range(0, 20):
        for k in range(0, n + 1):
            a = [bytes([i]) for i in range(n)]
            b = a[:k] + [b"x" + bytes([i]) for i in range(k, n)]
            assert chained_prefix_count(a, b) == k, (n, k)
            assert chained_prefix_count(a, b[: k]) == k and chained_prefix_count(a[: k + 1], b) == k


def test_common_prefix_len_starts_after_the_known_prefix_and_its_stride_is_capped():
    base = list(range(1000, 1000 + 3 * STRIDE_CAP + 77))
    for d in (0, 1, 63, 64, STRIDE_CAP - 1, STRIDE_CAP, 2 * STRIDE_CAP + 5, len(base) - 1):
        other = base[:d] + [-1] + base[d + 1:]
        for start in (0, d // 2, d):
            assert common_prefix_len(base, other, start=start) == d, (d, start)
    # `start` is taken as proved: the elements before it are not compared (the caller's hashes stand for them)
    assert common_prefix_len([9, 9, 3, 4], [1, 1, 3, 5], start=2) == 3
    assert common_prefix_len([1, 2], [1, 2], start=10) == 2 and common_prefix_len([1, 2], [1, 3], start=-5) == 1


def _revision_case(core: EngineFreeCore, monkeypatch, lcp: int, length: int = 40 * BS + 16):
    """A predecessor of `length` prompt tokens, fully prefilled and decoded 4 tokens; a revision sharing `lcp` tokens
    (fresh int objects, as msgpack decodes them on the wire). Returns (what certify_length was told was proved,
    the result, the oracle's certified length)."""
    import retire.transition as tr

    seen = []
    real = tr.certify_length

    def spy(**kw):
        seen.append(kw.get("known", 0))
        return real(**kw)

    monkeypatch.setattr(tr, "certify_length", spy)
    prompt = tokens(length, 5)
    rid = core.submit("t", "s", prompt, max_tokens=8)
    for _ in range(4):
        core.step()
    old = list(core.s.requests[rid].all_token_ids)
    new = [int(str(t)) for t in old[:lcp]] + [t + 1 for t in old[lcp:lcp + 40]]
    frontier = core.port.frontier(rid)
    res, _ = core.supersede("t", "s", 0, new)
    want = min(_lcp(old, new), frontier, len(new) - 1) // BS * BS
    return seen, res, want


def test_align_proves_whole_equal_blocks_by_sha256_hash_and_certifies_the_token_lcp(monkeypatch):
    for lcp in (0, 31, 32, 33, 20 * BS + 7, 40 * BS + 16, 40 * BS + 18):  # the last one inside the decoded tokens
        core = EngineFreeCore(num_blocks=256, block=BS, chunk=4096, max_model_len=4096)
        assert core.port.hash_block == BS
        seen, res, want = _revision_case(core, monkeypatch, lcp)
        assert seen == [min(lcp, 40 * BS + 16 + 3) // BS * BS], (lcp, seen)  # hashes cover computed full blocks
        assert res.inherited_tokens == want, (lcp, res, want)
        assert core.audit()["valid"]


def test_the_port_trusts_sha256_hashes_only():
    assert EngineFreeCore(hash_algo="sha256_cbor").port.hash_block == BS
    assert EngineFreeCore(hash_algo="xxhash").port.hash_block is None  # no request is built: xxhash isn't installed


def test_negative_control_an_untrusted_hash_proves_nothing(monkeypatch):
    """The port's verdict on an untrusted hash (None, as under xxhash) reaches ALIGN: the same case proves nothing
    by hash, and compares every token to the same certified length."""
    core = EngineFreeCore(num_blocks=256, block=BS, chunk=4096, max_model_len=4096)
    monkeypatch.setattr(core.port, "hash_block", None)
    seen, res, want = _revision_case(core, monkeypatch, 20 * BS + 7)
    assert seen == [0] and res.inherited_tokens == want == 20 * BS


def test_certify_length_takes_the_known_prefix_as_proved_and_compares_from_it():
    from retire.align import certify_length

    # the first two tokens differ, but the caller proved them equal (its hashes): the LCP runs from there
    a = certify_length(old_tokens=[9, 9, 3, 4, 5], new_prompt=[1, 1, 3, 4, 6, 7], frontier=10, align=1, known=2)
    assert a.lcp == 4 and a.certified == 4
    # without a proof nothing is assumed: a first token that differs is an LCP of 0
    b = certify_length(old_tokens=[5, 1, 2], new_prompt=[6, 1, 2, 3], frontier=10, align=1)
    assert b.lcp == 0 and b.certified == 0
