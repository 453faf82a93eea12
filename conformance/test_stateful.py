"""Stateful property test: a Hypothesis RuleBasedStateMachine drives submit / supersede / stale supersede /
consume / step / inject-fault against the real engine, checked against a shadow model of scopes and epochs.

Invariants (checked after every rule):
- only current epochs publish: every non-empty frame a consumer receives has the scope's current epoch (shadow);
- obsolete_tokens_published == 0;
- pins stay within quota: no handoff pin outlives its transition (pins == 0 between rules);
- refcounts are consistent: every block's ref_cnt equals its references from live block tables plus pins, and no
  obsolete execution is alive (engine audit);
- at drain (teardown) every block is free.
The CI profile is bounded (conftest: 12 examples x 12 steps); `--hypothesis-profile=soak` runs 1,000 examples.
"""
from __future__ import annotations

from collections import Counter

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens
from retire import Contract, StaleEpoch
from retire.faults import GenerationRace

SP = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
BLOCK = 32


class Shadow:
    def __init__(self, prompt):
        self.epoch = 0
        self.prompt = prompt
        self.streams = {}      # epoch -> async generator
        self.finished = set()  # epochs whose stream ended
        self.armed = False


class RetireMachine(RuleBasedStateMachine):
    scopes = Bundle("scopes")
    counts: Counter = Counter()  # rules executed across examples (the test asserts the run was not vacuous)

    def __init__(self, h):
        super().__init__()
        self.h = h
        self.eng = h.facade("retire")
        self.shadow: dict[str, Shadow] = {}
        self.n = 0
        self.violations: list[str] = []

    def run(self, coro):
        return self.h.run(coro, timeout=300)

    @initialize(target=scopes, seed=st.integers(0, 10 ** 6))
    def first_scope(self, seed):
        return self.submit(seed, 200)

    @rule(target=scopes, seed=st.integers(0, 10 ** 6), n=st.integers(40, 300))
    def submit(self, seed, n):
        name = f"s{self.n}"
        self.n += 1
        self.counts["submit"] += 1
        prompt = tokens(n, seed)
        assert self.run(self.eng.submit(name, prompt, SP)) == 0
        self.shadow[name] = Shadow(prompt)
        return name

    @rule(scope=scopes, keep=st.floats(0.0, 1.0), grow=st.integers(1, 60),
          quota=st.sampled_from([None, None, 0, 3]))
    def supersede(self, scope, keep, grow, quota):
        sh = self.shadow[scope]
        lcp = int(keep * len(sh.prompt))
        revised = revise(sh.prompt, lcp, lcp + grow, self.n)
        self.n += 1
        tr = self.run(self.eng.supersede(scope, sh.epoch, revised, SP, contract=Contract(pin_quota_blocks=quota)))
        sh.epoch += 1
        self.counts["supersede"] += 1
        self.counts["inherited" if tr.inherited_tokens else "cold"] += 1
        assert tr.epoch == sh.epoch
        frontier = min(r.frontier for r in tr.receipts)
        cap = min(lcp, frontier, len(revised) - 1)
        assert tr.inherited_tokens % BLOCK == 0 and tr.inherited_tokens <= cap, (tr, cap)
        if quota is not None:
            assert tr.inherited_tokens <= quota * BLOCK
        if sh.armed:
            assert tr.inherited_tokens == 0, "a generation race must force a cold successor"
            sh.armed = False
        sh.prompt = revised

    @rule(scope=scopes)
    def stale_supersede(self, scope):
        sh = self.shadow[scope]
        for bad in (sh.epoch + 1, sh.epoch - 1):
            if bad < 0:
                continue
            try:
                self.run(self.eng.supersede(scope, bad, sh.prompt, SP))
            except StaleEpoch:
                pass
            else:
                raise AssertionError("a stale SUPERSEDE was accepted")
        assert self.eng.current_epoch(scope) == sh.epoch

    @rule(scope=scopes, frames=st.integers(1, 4), old=st.booleans())
    def consume(self, scope, frames, old):
        sh = self.shadow[scope]
        epochs = [e for e in range(sh.epoch + 1) if e not in sh.finished]
        if not epochs:
            return
        epoch = epochs[0] if old else epochs[-1]
        agen = sh.streams.get(epoch)
        if agen is None:
            agen = sh.streams[epoch] = self.eng.stream(scope, epoch)

        async def pull():
            for _ in range(frames):
                try:
                    f = await agen.__anext__()
                except StopAsyncIteration:
                    sh.finished.add(epoch)
                    return
                self.counts["frames"] += 1
                if f.token_ids and f.epoch != sh.epoch:
                    self.violations.append(f"{scope}: epoch {f.epoch} published while {sh.epoch} is current")
                if f.finished:
                    sh.finished.add(epoch)
                    return
        self.run(pull())

    @rule()
    def step(self):
        self.run(self.eng.backend.sched("ping"))  # answered between two engine steps

    @rule(scope=scopes)
    def inject_generation_race(self, scope):
        sh = self.shadow[scope]
        if sh.armed:
            return
        self.run(GenerationRace(scope).inject(self.eng))  # healed by use (one-shot) or at teardown
        self.counts["faults"] += 1
        sh.armed = True

    @invariant()
    def only_current_epochs_publish(self):
        assert not self.violations, self.violations
        assert self.eng.stats()["obsolete_tokens_published"] == 0

    @invariant()
    def refcounts_pins_and_no_obsolete_execution(self):
        rep = self.run(self.eng.backend.sched("audit"))
        assert rep["valid"], rep["violations"]
        assert self.run(self.eng.backend.sched("stats"))["pins"] == 0

    def teardown(self):
        async def fin():
            for name, sh in self.shadow.items():
                if sh.armed:
                    await self.eng.backend.sched("disarm", {"scope": self.eng.table.key("default", name)})
                for agen in sh.streams.values():
                    await agen.aclose()
            await self.eng.drain()
            rep = await self.eng.audit()   # drained: every block free, no pin, no live obsolete execution
            await self.eng.close()
            return rep
        rep = self.run(fin())
        assert rep["valid"] and not rep["live_requests"]


def test_retire_state_machine(unit):
    RetireMachine.counts.clear()
    run_state_machine_as_test(lambda: RetireMachine(unit))
    c = RetireMachine.counts
    print(f"\nstate machine: {dict(c)}")
    assert c["supersede"] >= 5 and c["frames"] >= 5 and c["inherited"] >= 1, dict(c)


def test_negative_control_state_machine_catches_a_leaked_pin(unit):
    """The refcount invariant must fail when a block reference leaks: pin a block behind the ledger's back."""
    machine = RetireMachine(unit)
    machine.first_scope(seed=1)
    machine.step()
    import pytest

    async def leak():
        # a test-only leak through the command seam: touch a block without recording it
        return await unit.retire.backend.sched("leak_block_for_test", {"block_id": 5})
    unit.run(leak())
    with pytest.raises(AssertionError):
        machine.refcounts_pins_and_no_obsolete_execution()
    unit.run(unit.retire.backend.sched("leak_block_for_test", {"block_id": 5, "undo": True}))
    machine.teardown()
