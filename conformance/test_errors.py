"""Bad input gets a typed error and changes nothing: the old version keeps running to completion, no epoch advances,
vLLM's own request table gains no request, no supersede or submit is counted. The epoch races (concurrent and
stale SUPERSEDEs after a real one) are in test_epochs.py."""
import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import tokens
from oracles import collect
from retire import (Contract, EngineClosed, InvalidRequest, ScopeExists, StaleEpoch, SupersedeRefused, UnknownScope,
                    UnsupportedContract)

SP = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


async def _state(eng) -> dict:
    """What a refused call must leave unchanged: the facade's scope and counters, and vLLM's own request table."""
    live = (await eng.backend.sched("audit"))["live_requests"]
    return {"epoch": eng.current_epoch("s"), "internal_id": eng.internal_id("s"), "live": sorted(live),
            "supersedes": eng.stats()["supersedes"], "submitted": eng.stats().get("submitted", 0)}


@pytest.mark.parametrize("policy", ["retire", "native-cold", "native-prefix"])
def test_refused_calls_change_nothing(unit, policy):
    eng = unit.engines[policy]
    prompt = tokens(120, 21)

    async def go():
        await eng.submit("s", prompt, SP)
        before = await _state(eng)
        cases = [
            (UnknownScope, "unknown scope 'nope' for tenant 'default'",
             dict(scope="nope", expected_epoch=0, prompt_token_ids=prompt)),
            (UnknownScope, "unknown scope 's' for tenant 'other'",
             dict(scope="s", expected_epoch=0, prompt_token_ids=prompt, tenant="other")),
            (StaleEpoch, "expected epoch 1, current is 0", dict(scope="s", expected_epoch=1, prompt_token_ids=prompt)),
            (InvalidRequest, "prompt is empty", dict(scope="s", expected_epoch=0, prompt_token_ids=[])),
            (InvalidRequest, "max_model_len", dict(scope="s", expected_epoch=0, prompt_token_ids=tokens(2048, 1))),
            (InvalidRequest, "token id 1000000 is outside the vocabulary",
             dict(scope="s", expected_epoch=0, prompt_token_ids=[5, 10 ** 6])),
            (InvalidRequest, "token id -1 is outside the vocabulary",
             dict(scope="s", expected_epoch=0, prompt_token_ids=[5, -1])),
            (UnsupportedContract, "numerical mode 'bogus'", dict(scope="s", expected_epoch=0, prompt_token_ids=prompt,
                                                                 contract=Contract(mode="bogus"))),
            (UnsupportedContract, "dram_tier carries inherited state",
             dict(scope="s", expected_epoch=0, prompt_token_ids=prompt, contract=Contract(dram_tier=True,
                                                                                          inherit=False))),
        ]
        for exc, msg, kw in cases:
            with pytest.raises(exc, match=msg):
                await eng.supersede(sampling_params=SP, **kw)
        with pytest.raises(ScopeExists, match="scope 's' of tenant 'default' exists"):
            await eng.submit("s", prompt, SP)
        with pytest.raises(InvalidRequest, match="prompt is empty"):
            await eng.submit("t", [], SP)
        after = await _state(eng)
        new_live = set(after.pop("live")) - set(before.pop("live"))  # requests may finish meanwhile; none may start
        assert after == before and not new_live, f"a refused call changed state: {before} -> {after}, {new_live}"
        run = await collect(eng, "s")
        assert len(run.tokens) == 24 and not run.revoked  # the old version ran to completion, untouched
        # the refusals are typed: SupersedeRefused for authority, ValueError for malformed input
        assert issubclass(StaleEpoch, SupersedeRefused) and issubclass(InvalidRequest, ValueError)

    unit.run(go())


def test_calls_after_close_raise(unit):
    eng = unit.facade("retire")

    async def go():
        await eng.close()
        with pytest.raises(EngineClosed, match="engine is closed"):
            await eng.submit("x", tokens(10, 1), SP)
        with pytest.raises(EngineClosed, match="engine is closed"):
            await eng.supersede("x", 0, tokens(10, 1), SP)
        with pytest.raises(EngineClosed, match="engine is closed"):
            async for _ in eng.stream("x"):
                pass
        with pytest.raises(EngineClosed, match="engine is closed"):
            await eng.audit()
        # the shared engine is still serving the other facades
        await unit.retire.submit("alive", tokens(40, 2), SP)
        assert len((await collect(unit.retire, "alive")).tokens) == 24

    unit.run(go())
