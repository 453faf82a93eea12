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
