"""Fault discipline without an engine: composition refuses overlapping faults, and healing runs even when the body
fails (the facade's hook points are restored)."""
import asyncio

import pytest

from retire.faults import FaultConflict, ForgedTenant, LateCompletion, SlowConsumer, compose
from retire.switches import TestSeams


class FakeFacade:
    def __init__(self):
        self.seams = TestSeams()


def test_composing_two_faults_on_one_operation_is_refused():
    with pytest.raises(FaultConflict, match="both affect 'consume'"):
        compose(SlowConsumer(0.01), SlowConsumer(0.02))
    compose(SlowConsumer(0.01), LateCompletion("s"), ForgedTenant("x"))  # disjoint operations compose


def test_heal_runs_when_the_test_body_fails():
    eng = FakeFacade()
    fault = compose(SlowConsumer(0.01), LateCompletion("s"), ForgedTenant("x"))

    async def go():
        async with fault.on(eng):
            assert eng.seams.after_yield and eng.seams.on_dequeue and eng.seams.successor_tenant == "x"
            raise RuntimeError("the test body failed")

    with pytest.raises(RuntimeError, match="the test body failed"):
        asyncio.run(go())
    assert eng.seams == TestSeams()
    assert not fault.injected and not any(f.injected for f in fault.faults)


class _Out:
    def __init__(self, n):
        self.outputs = [type("C", (), {"token_ids": list(range(n))})()]


class _V:
    def __init__(self, scope, epoch=0, tenant="default"):
        self.scope, self.epoch, self.tenant = scope, epoch, tenant


class EpochFacade(FakeFacade):
    """A facade with the engine's epoch barrier (`wait_epoch`) and nothing else."""

    def __init__(self):
        super().__init__()
        self.epochs, self.ev = {}, asyncio.Event()

    async def wait_epoch(self, scope, epoch, tenant="default"):
        while self.epochs.get((tenant, scope), 0) < epoch:
            self.ev.clear()
            await self.ev.wait()

    def advance(self, scope, tenant="default"):
        self.epochs[(tenant, scope)] = self.epochs.get((tenant, scope), 0) + 1
        self.ev.set()


def test_busy_consumer_holds_the_next_frame_until_the_scope_advances():
    """BusyConsumer(scope, 3): frames pass dequeue until 3 tokens of (scope, 0, tenant) went through; the next frame
    with tokens waits for the scope's ADVANCE (no clock), and only that version's; heal releases a parked consumer.
    Negative control: a plain SlowConsumer holds nothing (it only sleeps after a yield), so the same frame passes
    before the advance."""
    from retire.faults import BusyConsumer

    async def go(fault, advance: bool):
        eng = EpochFacade()
        async with fault.on(eng):
            hooks = eng.seams.on_dequeue
            assert hooks if isinstance(fault, BusyConsumer) else not hooks
            for n in (1, 2):  # 3 tokens taken: the consumer is now busy
                for h in hooks:
                    await h(eng, _V("s"), _Out(n))
            for h in hooks:  # other tenant / scope / epoch pass
                for v in (_V("s", tenant="t2"), _V("x"), _V("s", epoch=1)):
                    await h(eng, v, _Out(5))
            nxt = asyncio.ensure_future(_through(eng, hooks, _V("s"), _Out(4)))
            for _ in range(5):
                await asyncio.sleep(0)
            held = not nxt.done()
            if advance:
                eng.advance("s", tenant="t2")  # another tenant's advance does not release
                for _ in range(5):
                    await asyncio.sleep(0)
                still = not nxt.done()
                eng.advance("s")
            else:
                still = None
        await asyncio.wait_for(nxt, 1)  # advanced, or released by heal at the end of the block
        return held, still, eng.seams == TestSeams()

    assert asyncio.run(go(BusyConsumer("s", 3), advance=True)) == (True, True, True)
    assert asyncio.run(go(BusyConsumer("s", 3), advance=False)) == (True, None, True)  # heal released it
    assert asyncio.run(go(SlowConsumer(0.01), advance=True))[0] is False  # negative control


async def _through(eng, hooks, v, out):
    for h in hooks:
        out = await h(eng, v, out)
    return out


async def _held_across_another_tenants_advance(eng, fault, nxt) -> bool:
    """Once `fault` holds `nxt`, advance scope "s" of another tenant: True iff `nxt` is still held after that."""
    await asyncio.wait_for(fault.held.wait(), 1)
    eng.advance("s", tenant="t2")
    for _ in range(5):
        await asyncio.sleep(0)
    return not nxt.done()


@pytest.mark.parametrize("kind", ["late-completion", "release-at-call"])
@pytest.mark.parametrize("release", ["own", "heal"])
def test_held_frame_is_released_by_its_own_trigger_or_by_heal(kind, release):
    """LateCompletion and ReleaseAtCall hold the first non-empty frame of (scope, 0, tenant) at dequeue: empty frames
    and other versions pass, the held frame stays held across other tenants' advances, and it is released by its own
    trigger (the scope's ADVANCE, or `calling()`) or, when that never comes, by heal; a healed fault never leaves a
    consumer parked. The held frame is released once; the version's later frames pass."""
    from retire.faults import ReleaseAtCall

    async def go():
        eng = EpochFacade()
        fault = LateCompletion("s") if kind == "late-completion" else ReleaseAtCall("s")
        async with fault.on(eng):
            hooks = eng.seams.on_dequeue
            for v, n in ((_V("s"), 0), (_V("s", tenant="t2"), 3), (_V("x"), 3), (_V("s", epoch=1), 3)):
                await _through(eng, hooks, v, _Out(n))
            assert not fault.held.is_set()
            nxt = asyncio.ensure_future(_through(eng, hooks, _V("s"), _Out(2)))
            held = await _held_across_another_tenants_advance(eng, fault, nxt)
            if release == "own":
                eng.advance("s") if kind == "late-completion" else fault.calling()
                await asyncio.wait_for(nxt, 1)
                await asyncio.wait_for(_through(eng, hooks, _V("s"), _Out(1)), 1)  # held once only
        await asyncio.wait_for(nxt, 1)
        return held, fault.held_tokens, fault.released, eng.seams == TestSeams()

    assert asyncio.run(go()) == (True, 2, 1, True)


@pytest.mark.parametrize("release", ["advance", "heal"])
def test_late_transfer_holds_until_the_engine_applied_the_advance_or_heal(release):
    """LateTransfer(scope, 1) holds the restore of (scope, 1, tenant) at `dram_before_install`: other versions pass;
    the held one waits for the frontend's ADVANCE and then for an engine poll that sees the new epoch (polls answered
    before it do not release it). Heal releases a held transfer without polling (no newer SUPERSEDE will come), and
    restores the seam."""
    from retire.faults.transfer import LateTransfer

    class Backend:
        def __init__(self):
            self.answers = [1, 1, 2]  # the engine applies the ADD on the third poll
            self.polls = 0

        async def sched(self, cmd, payload):
            assert cmd == "scope_epoch" and payload == {"scope": "s"}
            self.polls += 1
            return self.answers.pop(0)

    def t(scope="s", epoch=1, tenant="default"):
        return type("T", (), {"scope": scope, "epoch": epoch, "tenant": tenant,
                              "key": type("K", (), {"scope": scope})()})()

    async def go():
        eng = EpochFacade()
        eng.backend = Backend()
        eng.advance("s")  # the scope is at epoch 1, the version held
        fault = LateTransfer("s", 1)
        async with fault.on(eng):
            hooks = eng.seams.dram_before_install
            assert len(hooks) == 1
            for other in (t(epoch=0), t(scope="x"), t(tenant="t2")):
                await asyncio.wait_for(hooks[0](eng, other), 1)
            assert not fault.held.is_set()
            nxt = asyncio.ensure_future(hooks[0](eng, t()))
            held = await _held_across_another_tenants_advance(eng, fault, nxt)
            if release == "advance":
                eng.advance("s")
                await asyncio.wait_for(nxt, 1)
        await asyncio.wait_for(nxt, 1)
        return held, eng.backend.polls, fault.released, eng.seams == TestSeams()

    assert asyncio.run(go()) == (True, 3 if release == "advance" else 0, 1, True)
