"""Numerical modes of the contract (issue #5 item 8): `exact` successors are bit-identical to a cold run.

Rules:
- exact: `Contract(mode="exact")` certifies only multiples of lcm(block, prefill chunk) = 256 here, and only KV the
  predecessor wrote in a cold run's chunk shape (`retire.align.ChunkShape`). The successor then computes its suffix in
  chunks starting at multiples of 256, as a cold run does (checked on the scheduler's chunk log), so its token ids AND
  logprobs (and top-k logprobs) equal the cold oracle's with `==`, no tolerance. The cold oracle is
  `clean_run(revised)` on the stock oracle engine with the same shape (it reads no prefix cache).
- ordinary (alias of tolerant): certified at block granularity; judged by the logprob-closeness rule
  (`oracles.compare.compare_logprobs_close`) against the same cold oracle.
- Unaligned inheritance (tolerant, LCP off the chunk grid) must pass the logprob-closeness rule; on this build it was
  also bit-identical in every config measured (reported, not asserted).
- Negative control: one certified block moved by one ulp (`retire.faults.numeric.UlpNoise`) before the successor runs:
  the bit-identity check must FAIL while the logprob-closeness rule passes (the checker can fail).
"""
from __future__ import annotations

import asyncio

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from retire.trials import revision_trial
from oracles import compare_logprobs_close
from retire import Contract
from retire.align import ChunkShape, alignment_unit

CHUNK, BLOCK = 256, 32
SP_OLD = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=5)
PROMPT_LEN, NEW_LEN = 600, 560

# (seed, LCP): below, at and above the chunk boundaries 256 and 512 (certified 256 or 512 under "exact").
EXACT = [(1, 256), (2, 300), (3, 511), (4, 512), (5, 520), (6, 559), (7, 270), (8, 400), (9, 599), (10, 480)]
EXACT_SLOW = [(s, l) for s in (11, 12, 13) for l in (257, 384, 513, 544)] + [(14, 255), (15, 100)]
ORDINARY = [(21, 300), (22, 513)]
UNALIGNED = [(31, 288), (32, 320), (33, 416), (34, 544), (35, 300), (36, 480)]


@pytest.fixture(autouse=True)
def _empty_prefix_cache(request):
    """Exact mode certifies only KV written in a cold run's chunk shape; a prefix-cache hit on blocks another module
    wrote with the same prompt (in another shape) legitimately certifies less. Every case here starts from an empty
    prefix cache so the expected certified lengths are the cold-shaped ones."""
    if "unit" in request.fixturenames:
        h = request.getfixturevalue("unit")
        assert h.run(h.retire.backend.reset_prefix_cache()), "prefix cache reset refused (blocks in use)"
    yield


def bit_identical(a, b) -> tuple[bool, str]:
    """Exact rule: token ids, sampled-token logprobs and top-k logprobs all equal with `==`."""
    if a.tokens != b.tokens:
        return False, f"token ids differ: {a.tokens} vs {b.tokens}"
    if a.logprobs is None or b.logprobs is None:
        return False, "logprobs missing"
    if a.logprobs != b.logprobs:
        d = max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs))
        return False, f"logprobs differ (max |d| = {d:.3g})"
    if a.top_logprobs != b.top_logprobs:
        return False, "top-k logprobs differ"
    return True, f"{len(a.tokens)} tokens and logprobs bit-identical"


def _run_case(h, seed: int, lcp: int, contract: Contract, scope: str):
    prompt = tokens(PROMPT_LEN, seed)
    revised = revise(prompt, lcp, max(NEW_LEN, lcp + 40), seed)

    async def go():
        eng = h.retire
        rev = await revision_trial(eng, scope, prompt, revised, SP_OLD, SP_NEW, after_tokens=1, contract=contract,
                                   reset_cache=False)
        log = await eng.backend.sched("chunk_log", {"req_id": eng.internal_id(scope, 1)})
        cold = await h.oracle.clean_run(revised, SP_NEW)
        return rev, log, cold

    rev, log, cold = h.run(go())
    assert rev.obsolete == 0
    return revised, rev, log, cold


def _expected(lcp: int, unit: int) -> int:
    cap = min(lcp, PROMPT_LEN)  # the predecessor's whole prompt was written before the revision
    return cap - cap % unit


def _check_exact(h, seed, lcp, scope):
    revised, rev, log, cold = _run_case(h, seed, lcp, Contract(mode="exact"), scope)
    tr = rev.transition
    want = min(_expected(lcp, CHUNK), PROMPT_LEN - PROMPT_LEN % CHUNK)  # only full chunks are cold-shaped
    assert tr.inherited_tokens == want, (tr.inherited_tokens, want, tr.cold_reason)
    if want:
        assert tr.certificate.mode == "exact" and tr.certificate.tokens % CHUNK == 0
    # the successor's suffix ran in a cold run's chunk shape: starts at multiples of the chunk, full chunks
    # except the last, covering [inherited, len(revised))
    chunks = [tuple(c) for c in log["chunks"]]
    starts = list(range(want, len(revised), CHUNK))
    assert chunks == [(s, min(CHUNK, len(revised) - s)) for s in starts], chunks
    ok, detail = bit_identical(rev.new, cold)
    assert ok, f"exact successor (inherited {want}) vs clean_run: {detail}"


@pytest.mark.parametrize("seed,lcp", EXACT, ids=[f"s{s}-lcp{l}" for s, l in EXACT])
def test_exact_successor_is_bit_identical_to_cold(unit, seed, lcp):
    _check_exact(unit, seed, lcp, f"x{seed}")


@pytest.mark.slow
@pytest.mark.parametrize("seed,lcp", EXACT_SLOW, ids=[f"s{s}-lcp{l}" for s, l in EXACT_SLOW])
def test_exact_successor_is_bit_identical_to_cold_more_configs(unit, seed, lcp):
    _check_exact(unit, seed, lcp, f"xs{seed}")


@pytest.mark.parametrize("seed,lcp", ORDINARY, ids=[f"s{s}-lcp{l}" for s, l in ORDINARY])
def test_ordinary_successor_is_logprob_close_to_cold(unit, seed, lcp):
    revised, rev, _, cold = _run_case(unit, seed, lcp, Contract(mode="ordinary"), f"o{seed}")
    tr = rev.transition
    assert tr.inherited_tokens == _expected(lcp, BLOCK) and tr.certificate.mode == "tolerant"
    v = compare_logprobs_close(subject=rev.new, oracle=cold, subject_name="ordinary successor",
                               oracle_name="clean_run")
    assert v.valid is True, v.detail


def test_unaligned_inheritance_on_this_build(unit):
    """Tolerant inheritance at lengths off the chunk grid: the successor computes its suffix in other chunk splits
    than a cold run. Every config must pass the logprob-closeness rule. Measured on this build (unit model, bf16, CPU):
    all of them were also bit-identical (row results of the CPU kernels do not depend on the chunk split here), so the
    bit-identity tally is reported, not asserted; the checker's ability to fail is shown by the next test."""
    verdicts = []
    for seed, lcp in UNALIGNED:
        revised, rev, log, cold = _run_case(unit, seed, lcp, Contract(mode="tolerant"), f"n{seed}")
        n = rev.transition.inherited_tokens
        assert n == _expected(lcp, BLOCK) and n % CHUNK != 0
        assert log["chunks"][0][0] == n  # the suffix starts off the chunk grid
        close = compare_logprobs_close(subject=rev.new, oracle=cold, subject_name="tolerant successor",
                                       oracle_name="clean_run")
        assert close.valid is True, close.detail
        verdicts.append((seed, lcp, *bit_identical(rev.new, cold)))
    print("UNALIGNED bit-identical:", sum(v[2] for v in verdicts), "of", len(verdicts), verdicts)


@pytest.mark.parametrize("seed", [51, 52, 53])
def test_negative_control_one_ulp_in_inherited_kv_fails_bit_identity(unit, seed):
    """The bit-identity checker can fail: the successor inherits 512 certified tokens (exact mode), and before it runs
    one certified block is moved by one unit in the last place (UlpNoise: the size of a rounding difference between
    execution shapes). Bit-identity against the cold run must FAIL; the logprob-closeness rule still passes."""
    from oracles import collect
    from retire.barriers import HoldSuccessor, wait_engine
    from retire.faults.numeric import UlpNoise

    prompt = tokens(PROMPT_LEN, seed)
    revised = revise(prompt, 530, NEW_LEN, seed)

    async def go():
        eng = unit.retire
        await eng.submit("ulp", prompt, SP_OLD)
        old = asyncio.ensure_future(collect(eng, "ulp", 0))
        await wait_engine(eng, "ulp", out_tokens=1)
        async with HoldSuccessor(eng, "ulp") as hold:
            tr = await eng.supersede("ulp", 0, revised, SP_NEW, contract=Contract(mode="exact"))
            async with UlpNoise([tr.certificate.block_ids[0][-1]]).on(eng):
                await hold.release()
                new = await collect(eng, "ulp", 1)
        await old
        return tr, new, await unit.oracle.clean_run(revised, SP_NEW)

    tr, new, cold = unit.run(go())
    assert tr.inherited_tokens == 512
    ok, detail = bit_identical(new, cold)
    assert not ok, "bit-identity must catch a one-ulp difference in inherited KV"
    close = compare_logprobs_close(subject=new, oracle=cold, subject_name="successor (1 ulp)", oracle_name="clean_run")
    assert close.valid is True, close.detail


def test_exact_mode_does_not_certify_a_misaligned_predecessor(unit):
    """A predecessor that itself inherited an unaligned prefix (288 tokens, tolerant) computed its suffix off the
    chunk grid: under "exact" only the cold-shaped part (256) of its KV may be certified, and the result is still
    bit-identical to the cold run. Without the provenance check ALIGN would certify 512 here."""
    prompt = tokens(PROMPT_LEN, 41)
    mid = revise(prompt, 300, PROMPT_LEN, 41)
    final = revise(mid, 540, NEW_LEN, 42)

    async def go():
        eng = unit.retire
        from oracles import collect
        from retire.barriers import wait_engine

        await eng.submit("mis", prompt, SP_OLD)
        await wait_engine(eng, "mis", out_tokens=1)
        tr1 = await eng.supersede("mis", 0, mid, SP_OLD, contract=Contract(mode="tolerant"))
        await wait_engine(eng, "mis", out_tokens=1, epoch=1)
        shape = await eng.backend.sched("chunk_log", {"req_id": eng.internal_id("mis", 1)})
        tr2 = await eng.supersede("mis", 1, final, SP_NEW, contract=Contract(mode="exact"))
        new = await collect(eng, "mis", 2)
        return tr1, shape, tr2, new, await unit.oracle.clean_run(final, SP_NEW)

    tr1, shape, tr2, new, cold = unit.run(go())
    assert tr1.inherited_tokens == 288 and shape["exact_extent"] == 288
    assert tr2.inherited_tokens == 256, tr2
    ok, detail = bit_identical(new, cold)
    assert ok, detail


# ------------------------------------------------------------------------------------------------ no engine
def test_mode_alias_and_unit():
    assert Contract(mode="ordinary").normalized().mode == "tolerant"
    assert Contract(mode="ordinary").to_wire()["mode"] == "tolerant"
    assert alignment_unit(BLOCK, "exact", CHUNK) == 256 and alignment_unit(BLOCK, "tolerant", CHUNK) == BLOCK
    assert alignment_unit(96, "exact", 256) == 768  # lcm, not max


def test_chunk_shape_extent_rules():
    s = ChunkShape(256)
    for start, n in [(0, 256), (256, 256), (512, 88)]:  # a 600-token prompt alone: last chunk partial
        s.observe("a", start, n, 600)
    assert s.extent("a") == 512 and s.log("a") == [(0, 256), (256, 256), (512, 88)]
    s.observe("a", 600, 1, 600)  # decode
    assert s.extent("a") == 512
    s.observe("b", 0, 255, 600)  # co-scheduled with a decode: the chunk is short, the shape is lost from 0
    s.observe("b", 255, 256, 600)
    assert s.extent("b") == 0
    s.observe("c", 288, 256, 600)  # prefix-cache hit of unknown provenance
    assert s.extent("c") == 0
    s.start("d", inherited=512, extent=512)  # exact successor: continues on the grid
    s.observe("d", 512, 256, 900)
    assert s.extent("d") == 768
    s.start("e", inherited=288, extent=512)  # unaligned successor: [0, 288) is cold-shaped, nothing after it
    s.observe("e", 288, 256, 900)
    assert s.extent("e") == 288
    s.observe("e", 0, 256, 900)  # recomputation after preemption: provenance lost
    assert s.extent("e") == 0


def test_chunk_shape_block_provenance_for_prefix_cache_hits():
    s = ChunkShape(256)
    table = lambda ids, gen=0: [(32, [(b, gen, False) for b in ids])]
    a_blocks = list(range(1, 20))  # 600 tokens -> 19 blocks
    s.observe("a", 0, 256, 600, table(a_blocks))
    s.observe("a", 256, 256, 600, table(a_blocks))
    s.observe("a", 512, 88, 600, table(a_blocks))
    assert s.extent("a") == 512
    # a request hitting a's first 18 blocks (576 tokens): only the 16 blocks of full chunks are marked
    s.observe("b", 576, 24, 600, table(a_blocks[:18] + [40]))
    assert s.extent("b") == 512 and not s.open["b"]
    # a hit of exactly 512 tokens continues on the grid
    s.observe("c", 512, 256, 1000, table(a_blocks[:16] + list(range(50, 58))))
    assert s.extent("c") == 768
    # block 3 reallocated (its generation moved on): the marked prefix ends before it
    reused = [(b, 1 if b == 3 else 0, False) for b in a_blocks[:16]]
    s.observe("d", 512, 100, 700, [(32, reused)])
    assert s.extent("d") == 64
