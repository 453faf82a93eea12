"""Bad input gets a typed error and changes nothing (the old version keeps running, no epoch advances)."""
import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import tokens
from oracles import collect
from retire import (Contract, EngineClosed, InvalidRequest, ScopeExists, StaleEpoch, SupersedeRefused, UnknownScope,
                    UnsupportedContract)

SP = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("policy", ["retire", "native-cold", "native-prefix"])
def test_refused_calls_change_nothing(unit, policy):
    eng = unit.engines[policy]
    prompt = tokens(120, 21)

    async def go():
        await eng.submit("s", prompt, SP)
        before = (eng.current_epoch("s"), eng.internal_id("s"), dict(eng.stats()))
        cases = [
            (UnknownScope, dict(scope="nope", expected_epoch=0, prompt_token_ids=prompt)),
            (UnknownScope, dict(scope="s", expected_epoch=0, prompt_token_ids=prompt, tenant="other")),
            (StaleEpoch, dict(scope="s", expected_epoch=1, prompt_token_ids=prompt)),
            (InvalidRequest, dict(scope="s", expected_epoch=0, prompt_token_ids=[])),
            (InvalidRequest, dict(scope="s", expected_epoch=0, prompt_token_ids=tokens(2048, 1))),
            (InvalidRequest, dict(scope="s", expected_epoch=0, prompt_token_ids=[5, 10 ** 6])),
            (InvalidRequest, dict(scope="s", expected_epoch=0, prompt_token_ids=[5, -1])),
            (UnsupportedContract, dict(scope="s", expected_epoch=0, prompt_token_ids=prompt,
                                       contract=Contract(mode="bogus"))),
            (UnsupportedContract, dict(scope="s", expected_epoch=0, prompt_token_ids=prompt,
                                       contract=Contract(dram_tier=True, inherit=False))),
        ]
        for exc, kw in cases:
            with pytest.raises(exc):
                await eng.supersede(sampling_params=SP, **kw)
        with pytest.raises(ScopeExists):
            await eng.submit("s", prompt, SP)
        with pytest.raises(InvalidRequest):
            await eng.submit("t", [], SP)
        assert (eng.current_epoch("s"), eng.internal_id("s")) == before[:2]
        run = await collect(eng, "s")
        assert len(run.tokens) == 24 and not run.revoked  # the old version ran to completion, untouched
        # the refusals are typed: SupersedeRefused for authority, ValueError for malformed input
        assert issubclass(StaleEpoch, SupersedeRefused) and issubclass(InvalidRequest, ValueError)

    unit.run(go())


def test_calls_after_close_raise(unit):
    eng = unit.facade("retire")

    async def go():
        await eng.close()
        with pytest.raises(EngineClosed):
            await eng.submit("x", tokens(10, 1), SP)
        with pytest.raises(EngineClosed):
            await eng.supersede("x", 0, tokens(10, 1), SP)
        with pytest.raises(EngineClosed):
            async for _ in eng.stream("x"):
                pass
        with pytest.raises(EngineClosed):
            await eng.audit()
        # the shared engine is still serving the other facades
        await unit.retire.submit("alive", tokens(40, 2), SP)
        assert len((await collect(unit.retire, "alive")).tokens) == 24

    unit.run(go())
