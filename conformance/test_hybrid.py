"""Two KV groups (Gemma3-shaped: sliding window 128 + full attention): one authority coordinate for both.

Checked per case: one FENCE receipt per KV group vLLM built (`ping`: 2 groups); the receipt's writer frontier is at
least the frontier the engine reported before the call (writes never go backwards); ALIGN's certified length is a
multiple of the block boundary shared by both groups (the LCM of their block sizes); in the sliding-window group only the
window ending at the certified length is live, the blocks before it are null placeholders (block id 0) that are
neither certified nor pinned (audit after the test proves no pin or reference leaks); the successor equals its oracle.

Comparison rule: exact against `clean_prefix_run(revised[:inherited], revised)` when the inherited length is a multiple
of the prefill chunk (256) and the oracle's own prefix-cache hit is exactly that length (vLLM's hybrid lookup can
stop a block or more short), else the logprob-closeness rule against the same run; a cold successor is compared
exactly with `clean_run`.

Cases: the revision lands inside the predecessor's prefill with the LCP beyond its frontier, so the window ending at
the certified length is still live (inherits); and the predecessor has decoded far past the LCP, so its sliding group
already dropped blocks the successor would attend to: ALIGN must go cold with the sliding-window reason (the negative
control of the window logic; the full-attention group alone would still hold the whole prefix).
"""
import asyncio
from math import lcm

from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from oracles import assert_logprobs_close, assert_same_tokens, collect
from retire.barriers import wait_engine

CHUNK, WINDOW = 256, 128
SP_OLD = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=5)


async def _case(h, scope, prompt, revised, *, frontier=None, out_tokens=None):
    eng = h.retire
    ping = await eng.backend.sched("ping")
    await eng.submit(scope, prompt, SP_OLD)
    old = asyncio.ensure_future(collect(eng, scope, 0))
    st = await wait_engine(eng, scope, frontier=frontier, out_tokens=out_tokens, epoch=0)
    tr = await eng.supersede(scope, 0, revised, SP_NEW)
    table = await eng.backend.sched("block_table", {"req_id": eng.internal_id(scope, 1)})
    new = await collect(eng, scope, 1)
    await old
    n = tr.inherited_tokens
    oracle = await (h.oracle.clean_prefix_run(revised[:n], revised, SP_NEW) if n else
                    h.oracle.clean_run(revised, SP_NEW))
    return ping, st, tr, table, new, oracle


def _one_coordinate(tr, ping, st):
    """One receipt per KV group vLLM built, at a frontier no lower than the one the engine reported before the call.
    (The receipts' epoch and frontier are one value copied per group by construction: comparing them with each other
    could not fail, so they are compared with the engine's earlier report instead.)"""
    assert ping["groups"] == 2, ping
    assert [r.participant for r in tr.receipts] == ["kv-group-0", "kv-group-1"]
    assert st is not None and tr.receipts[0].frontier >= st["frontier"], (tr.receipts, st)
    return lcm(*ping["group_block_sizes"])


def test_lcp_within_window_inherits_both_groups(hybrid):
    prompt = tokens(1900, 41)
    revised = revise(prompt, 1800, 1850, 41)
    ping, st, tr, table, new, oracle = hybrid.run(_case(hybrid, "win", prompt, revised, frontier=CHUNK))
    unit = _one_coordinate(tr, ping, st)
    f = tr.receipts[0].frontier
    assert f < len(prompt), f"revision landed after the prefill (frontier {f})"
    n = tr.inherited_tokens
    assert tr.cold_reason is None and n == f // unit * unit > 0, tr
    cert = tr.certificate
    assert cert.tokens == n and len(cert.block_ids) == 2
    bs = ping["group_block_sizes"]
    sliding = [g for g, ids in enumerate(cert.block_ids) if 0 in ids]
    full = [g for g in range(2) if g not in sliding]
    assert len(sliding) == 1 and len(full) == 1, cert.block_ids  # one sliding group with placeholders, one full
    s, fg = sliding[0], full[0]
    assert len(cert.block_ids[fg]) == n // bs[fg] and 0 not in cert.block_ids[fg]
    first_live = max(0, n - WINDOW + 1) // bs[s]
    assert all(b == 0 for b in cert.block_ids[s][:first_live]), cert.block_ids[s]      # placeholders, not certified
    assert all(b != 0 for b in cert.block_ids[s][first_live:]), cert.block_ids[s]      # the live window
    # RESUME: the successor's tables alias exactly the certified blocks (placeholders stay placeholders)
    for g in range(2):
        assert tuple(table[g][: len(cert.block_ids[g])]) == cert.block_ids[g]
    assert hybrid.retire.stats()["obsolete_tokens_published"] == 0
    # vLLM's own hybrid prefix-cache lookup may reuse less than n (its sliding-window hit rule is its own): the
    # execution shapes then differ and the closeness rule applies.
    name = f"clean_prefix_run[:{n}] (oracle reused {oracle.inherited_tokens})"
    if n % CHUNK == 0 and oracle.inherited_tokens == n:
        assert_same_tokens(subject=new, oracle=oracle, subject_name="retire successor (hybrid)", oracle_name=name)
    else:
        assert_logprobs_close(subject=new, oracle=oracle, subject_name="retire successor (hybrid)", oracle_name=name)


def test_negative_control_dropped_window_blocks_go_cold(hybrid):
    """The predecessor decoded past prompt 600; the revision shares only 300 tokens. The full group still holds
    blocks 0..8, but the sliding group of the predecessor nulled everything before its own window, so the blocks the
    successor attends to at 288 tokens are gone: cold, with the reason, and exact against clean_run."""
    prompt = tokens(600, 42)
    revised = revise(prompt, 300, 500, 42)
    ping, st, tr, table, new, oracle = hybrid.run(_case(hybrid, "drop", prompt, revised, out_tokens=1))
    _one_coordinate(tr, ping, st)
    assert tr.receipts[0].frontier >= 600
    assert tr.inherited_tokens == 0 and tr.certificate is None and new.num_cached_tokens == 0  # vLLM's count too
    assert tr.cold_reason is not None and "sliding window" in tr.cold_reason, tr.cold_reason
    assert hybrid.retire.stats()["obsolete_tokens_published"] == 0
    assert_same_tokens(subject=new, oracle=oracle, subject_name="cold successor (hybrid)", oracle_name="clean_run")
