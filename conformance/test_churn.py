"""Churn between a revision and its successor's admission (issue #5 path 5): `Churn(fraction_of_capacity)` submits
unique-prefix requests totalling fraction x KV capacity tokens (retire/faults/churn.py; driver `churn_trial`).

At 1.1x capacity, retire keeps 100% of the certified prefix through the HBM pin (the held successor's table: the
certified pages are bit-identical after churn) and through the DRAM tier (pages copied out, blocks returned, restored
digest-checked), while native-prefix keeps less: the positive control that the churn really evicts. At 0.5x native
still finds its whole prefix (the metric is not trivially zero). Every arm's successor equals its oracle, and all arms
produce the same greedy tokens. Engine: `unit-churn` (unit model, 128 KV blocks = 4064 usable tokens).
"""
import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from retire.trials import Judge
from retire.faults.churn import ARMS, Churn, churn_trial

SP_OLD = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
SP_NEW = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=5)


@pytest.fixture
def churn(device, pool):
    from conftest import _harness
    yield from _harness(pool, "unit-churn")


def _facade(h, arm):
    return h.native_prefix if arm == "native" else h.retire


def _prompts(seed):
    prompt = tokens(1100, seed)
    return prompt, revise(prompt, 1040, 1100, seed)  # certified: 1024 tokens = 32 blocks = 4 prefill chunks


def test_churn_over_capacity_retire_keeps_certified_prefix(churn):
    prompt, revised = _prompts(71)

    async def go():
        judge = Judge(churn.oracle)
        out = {}
        for i, arm in enumerate(ARMS):
            t = await churn_trial(_facade(churn, arm), arm, f"ch-{arm}", prompt, revised, SP_OLD, SP_NEW, 1.1,
                                  seed=100 + i)
            t.ok, t.verdict = await judge.check(arm, revised, SP_NEW, t.new, t.retained)
            out[arm] = t
        return out

    out = churn.run(go())
    nat, hbm, dram = out["native"], out["retire_hbm"], out["retire_dram"]
    for t in out.values():
        assert t.cache_reset, f"{t.arm}: prefix cache not reset before the trial"
        assert t.churned_tokens >= 1.1 * t.capacity_tokens - 1, (t.churned_tokens, t.capacity_tokens)
        assert t.ok, f"{t.arm}: {t.verdict}"
    assert hbm.certified == dram.certified == nat.certified == 1024
    assert hbm.certified_by_engine == dram.certified_by_engine == 1024
    assert hbm.retained == 1024 and hbm.pages_intact_after_churn, hbm.row()
    assert dram.retained == 1024 and dram.dram_state == "restored", dram.row()
    assert dram.free_blocks_while_held == 127, dram.row()  # capacity returned while the successor waited
    assert nat.retained < nat.certified, f"positive control: churn at 1.1x must evict native's prefix: {nat.row()}"
    assert nat.new.tokens == hbm.new.tokens == dram.new.tokens  # all arms: the same greedy successor


def test_churn_under_capacity_native_keeps_prefix(churn):
    """Control for the metric: at 0.5x capacity the prefix blocks are never reached by the allocator."""
    prompt, revised = _prompts(72)

    async def go():
        t = await churn_trial(churn.native_prefix, "native", "ch-low", prompt, revised, SP_OLD, SP_NEW, 0.5, seed=200)
        t.ok, t.verdict = await Judge(churn.oracle).check("native", revised, SP_NEW, t.new, t.retained)
        return t

    t = churn.run(go())
    assert t.ok, t.verdict
    assert t.retained == t.certified == 1024, t.row()


def test_churn_fault_discipline(churn):
    """Churn declares what it affects, conflicts with another capacity fault, and heal closes its facade."""
    from retire.faults import compose, FaultConflict

    with pytest.raises(FaultConflict, match="both affect 'kv.capacity'"):
        compose(Churn(0.5), Churn(1.0))

    async def go():
        f = Churn(0.05, seed=300)
        async with f.on(churn.retire):
            pass
        return f

    f = churn.run(go())
    assert not f.injected and f._facade.closed and f.requests >= 1
    assert f.churned_tokens == round(0.05 * f.capacity_tokens)
