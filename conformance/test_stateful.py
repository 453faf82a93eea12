"""Stateful property test on the real engine: a Hypothesis RuleBasedStateMachine drives the facade with adversarial
actions and checks every step against a shadow model of scopes and epochs and against what consumers received.

Actions: submit (tenant and scope names with '/', '#', unicode and 1,000 characters); SUPERSEDE with random
overlap, pin quota and DRAM tier; two concurrent SUPERSEDEs of one epoch; truncation revisions (the revision is a
prefix of the old prompt, block-aligned or not); stale, future and negative epochs; another tenant naming the scope;
consume frames of any live version; step; faults (a generation race on the next SUPERSEDE, a forged tenant on one).

Invariants (after every rule), all judged outside the code under test unless noted:
- exactly one current version per scope: the facade's epoch equals the shadow's, and vLLM's own request table
  (`audit`'s live requests) holds no request of a version the shadow knows is superseded;
- no output of a non-current version is published: every frame with tokens of epoch e that a consumer received after
  the SUPERSEDE of e was called (consumer's clock) is a violation;
- a refused call changes nothing: the scope's epoch and current request and the number of supersedes are the same
  before and after, vLLM's request table gained no request (stale / future / negative epoch, another tenant, the
  concurrent loser), and no version ends revoked unless a SUPERSEDE of it was called;
- concurrent SUPERSEDEs of one epoch: exactly one returns, the others raise StaleEpoch;
- certified length: a multiple of the block, at most min(LCP, len(new) - 1) computed from the prompts (and at most
  the receipts' frontier), at most the pin quota; a truncation with its predecessor live and no fault certifies
  exactly min(len(new) - 1, frontier) rounded down; an armed generation race forces cold; a forged tenant is refused
  (UnknownScope) and changes nothing;
- a cold successor is cold by vLLM's count: its frames carry `num_cached_tokens == 0`;
- refcounts: every block's ref_cnt equals its table references plus pins, no pin outlives its transition, no
  obsolete execution is alive (engine audit, the subject's own check of vLLM's block pool); at teardown every
  block is free.
Profiles (conftest): `ci` 100 examples x 20 steps in the default suite; `soak` 1,000 x 20 (`make soak`, whose last
line reports schedules, supersedes, faults, violations and wall time from results/soak.json).
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from vllm import SamplingParams

from conformance.fixtures.prompts import revise, tokens, truncate
from retire import Contract, StaleEpoch, UnknownScope
from retire.barriers import wait_engine
from retire.faults import ForgedTenant, GenerationRace
from retire.trials import ConsumerClock

SP = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
BLOCK = 32
STEP_BOUND = 300  # seconds any one engine interaction may take before the rule fails (a hang, not a slow step)
# Adversarial names. A unique "-<n>" suffix on every scope keeps joined keys apart, so this machine exercises the
# characters, not the known aliasing of tenant/scope joins (that one is test_names.py's slash-collision case).
TENANTS = ["default", "A", "A/x", "t#1", "τ-ü☃", "T" * 1000]
SCOPE_BASES = ["s", "x/y", "1#s", "σκόπος/€", "S" * 1000]
QUOTAS = [None, None, None, 0, 1, 3, 40]


class Shadow:
    def __init__(self, tenant: str, scope: str, prompt: list[int]):
        self.tenant, self.scope = tenant, scope
        self.epoch = 0
        self.prompt = prompt
        self.streams: dict = {}        # epoch -> async generator
        self.finished: set = set()     # epochs whose stream ended
        self.called: dict = {}         # epoch e -> consumer-clock Tick of the SUPERSEDE of e
        self.cold: set = set()         # epochs created cold (inherited 0)
        self.armed = False             # a GenerationRace waits for the next SUPERSEDE


class RetireMachine(RuleBasedStateMachine):
    scopes = Bundle("scopes")
    counts: Counter = Counter()  # across examples: the test asserts the run was not vacuous; `make soak` reports it

    def __init__(self, h):
        super().__init__()
        self.h = h
        self.eng = h.facade("retire")
        self.clock = ConsumerClock()
        self.shadow: dict[tuple[str, str], Shadow] = {}
        self.n = 0
        self.violations: list[str] = []

    def run(self, coro):
        return self.h.run(coro, timeout=STEP_BOUND)

    # ------------------------------------------------------------------ helpers
    def _snapshot(self, key) -> dict:
        sh = self.shadow[key]
        live = self.run(self.eng.backend.sched("audit"))["live_requests"]
        return {"epoch": self.eng.current_epoch(sh.scope, sh.tenant),
                "id": self.eng.internal_id(sh.scope, tenant=sh.tenant), "live": sorted(live),
                "supersedes": self.eng.stats()["supersedes"]}

    def _refused_changes_nothing(self, key, call, exc, match: str) -> None:
        before = self._snapshot(key)
        with pytest.raises(exc, match=match):
            self.run(call())
        after = self._snapshot(key)
        new_live = set(after.pop("live")) - set(before.pop("live"))  # requests may finish meanwhile, none may start
        assert after == before and not new_live, f"a refused call changed state: {before} -> {after}, {new_live}"

    def _check_transition(self, sh: Shadow, tr, revised, lcp: int, quota, forced_cold: bool) -> None:
        inh = tr.inherited_tokens
        assert inh % BLOCK == 0 and inh <= min(lcp, len(revised) - 1), (inh, lcp, len(revised))
        if tr.receipts:
            assert inh <= min(r.frontier for r in tr.receipts), (inh, tr.receipts)
        if quota is not None:
            assert inh <= quota * BLOCK, (inh, quota)
        if forced_cold:
            assert inh == 0, f"a forced-cold SUPERSEDE inherited {inh} tokens ({tr.cold_reason})"
        self.counts["inherited" if inh else "cold"] += 1
        if not inh:
            sh.cold.add(sh.epoch)

    def _supersede(self, key, revised, contract: Contract, *, lcp: int, forged: bool = False):
        sh = self.shadow[key]
        if forged:  # a successor that names another tenant reaches no scope of ours: refused, nothing changed
            async def go():
                async with ForgedTenant("intruder").on(self.eng):
                    return await self.eng.supersede(sh.scope, sh.epoch, revised, SP, contract=contract,
                                                    tenant=sh.tenant)
            self._refused_changes_nothing(key, go, UnknownScope, match="unknown scope .* for tenant 'intruder'")
            self.counts["refused"] += 1
            return None
        sh.called[sh.epoch] = self.clock.mark(f"{key}:{sh.epoch}")
        tr = self.run(self.eng.supersede(sh.scope, sh.epoch, revised, SP, contract=contract, tenant=sh.tenant))
        forced = sh.armed
        sh.armed = False
        sh.epoch += 1
        assert tr.epoch == sh.epoch
        self.counts["supersede"] += 1
        self._check_transition(sh, tr, revised, lcp, contract.pin_quota_blocks, forced)
        sh.prompt = revised
        return tr

    # ------------------------------------------------------------------ rules
    @initialize(target=scopes, seed=st.integers(0, 10 ** 6))
    def first_scope(self, seed):
        return self.submit(0, 0, seed, 200)

    @rule(target=scopes, t=st.integers(0, len(TENANTS) - 1), b=st.integers(0, len(SCOPE_BASES) - 1),
          seed=st.integers(0, 10 ** 6), n=st.integers(40, 300))
    def submit(self, t, b, seed, n):
        tenant, scope = TENANTS[t], f"{SCOPE_BASES[b]}-{self.n}"
        self.n += 1
        prompt = tokens(n, seed)
        assert self.run(self.eng.submit(scope, prompt, SP, tenant=tenant)) == 0
        self.shadow[(tenant, scope)] = Shadow(tenant, scope, prompt)
        self.counts["submit"] += 1
        return (tenant, scope)

    @rule(key=scopes, keep=st.floats(0.0, 1.0), grow=st.integers(1, 60), quota=st.sampled_from(QUOTAS),
          dram=st.booleans(), forged=st.booleans())
    def supersede(self, key, keep, grow, quota, dram, forged):
        sh = self.shadow[key]
        lcp = int(keep * len(sh.prompt))
        revised = revise(sh.prompt, lcp, lcp + grow, self.n)
        self.n += 1
        forged = forged and not dram and self.n % 5 == 0
        if forged:
            self.counts["faults"] += 1
        self._supersede(key, revised, Contract(pin_quota_blocks=quota, dram_tier=dram), lcp=lcp, forged=forged)
        self.counts["dram"] += dram

    @rule(key=scopes, frac=st.floats(0.05, 1.0), aligned=st.booleans())
    def truncation(self, key, frac, aligned):
        """The revision is a prefix of the old prompt: block-aligned or not."""
        sh = self.shadow[key]
        k = max(1, int(frac * len(sh.prompt)))
        if aligned:
            k = max(BLOCK, k - k % BLOCK)
        if k > len(sh.prompt):
            return
        if aligned and k % BLOCK:
            return
        was_armed = sh.armed
        tr = self._supersede(key, truncate(sh.prompt, k), Contract(), lcp=k)
        self.counts["truncation"] += 1
        if tr.cold_reason is None and tr.receipts and not was_armed:
            cap = min(k - 1, min(r.frontier for r in tr.receipts))
            assert tr.inherited_tokens == cap - cap % BLOCK, (tr.inherited_tokens, k, tr.receipts)

    @rule(key=scopes, keep=st.floats(0.0, 1.0))
    def concurrent_supersedes(self, key, keep):
        """Two SUPERSEDEs of the same epoch at once: exactly one wins, the other gets StaleEpoch and changes nothing."""
        sh = self.shadow[key]
        lcp = int(keep * len(sh.prompt))
        revs = [revise(sh.prompt, lcp, lcp + 20 + i, self.n + i) for i in range(2)]
        self.n += 2
        sh.called[sh.epoch] = self.clock.mark(f"{key}:{sh.epoch}")

        async def both():
            return await asyncio.gather(*(self.eng.supersede(sh.scope, sh.epoch, r, SP, tenant=sh.tenant)
                                          for r in revs), return_exceptions=True)
        res = self.run(both())
        won = [(r, x) for r, x in zip(revs, res) if not isinstance(x, BaseException)]
        lost = [x for x in res if isinstance(x, BaseException)]
        assert len(won) == 1 and len(lost) == 1 and isinstance(lost[0], StaleEpoch), res
        forced = sh.armed
        sh.armed = False
        sh.epoch += 1
        revised, tr = won[0]
        assert tr.epoch == sh.epoch
        self.counts["supersede"] += 1
        self.counts["concurrent"] += 1
        self._check_transition(sh, tr, revised, lcp, None, forced)
        sh.prompt = revised
        live = self.run(self.eng.backend.sched("audit"))["live_requests"]
        mine = {v.internal_id for v in self.eng.table.get(sh.tenant, sh.scope).versions.values()}
        assert set(live) & mine <= {self.eng.internal_id(sh.scope, tenant=sh.tenant)}, (live, mine)

    @rule(key=scopes, kind=st.sampled_from(["stale", "future", "negative"]))
    def bad_epoch(self, key, kind):
        sh = self.shadow[key]
        bad = {"stale": sh.epoch - 1, "future": sh.epoch + 1 + self.n % 3, "negative": -1 - self.n % 2}[kind]
        if bad == sh.epoch:
            return
        self._refused_changes_nothing(
            key, lambda: self.eng.supersede(sh.scope, bad, sh.prompt, SP, tenant=sh.tenant), StaleEpoch,
            f"expected epoch {bad}, current is {sh.epoch}")
        self.counts["refused"] += 1

    @rule(key=scopes, t=st.integers(0, len(TENANTS) - 1))
    def cross_tenant(self, key, t):
        """Another tenant names this scope: UnknownScope, and nothing changes."""
        sh = self.shadow[key]
        tenant = TENANTS[t]
        if (tenant, sh.scope) in self.shadow:
            return
        self._refused_changes_nothing(
            key, lambda: self.eng.supersede(sh.scope, sh.epoch, sh.prompt, SP, tenant=tenant), UnknownScope,
            "unknown scope")
        self.counts["refused"] += 1

    @rule(key=scopes, frames=st.integers(1, 4), old=st.booleans())
    def consume(self, key, frames, old):
        sh = self.shadow[key]
        epochs = [e for e in range(sh.epoch + 1) if e not in sh.finished]
        if not epochs:
            return
        epoch = epochs[0] if old else epochs[-1]
        agen = sh.streams.get(epoch)
        if agen is None:
            # stream_outputs, not stream: closing it at teardown releases the version at once (closing `stream()`
            # leaves its inner generator to the garbage collector, which releases the consumer a loop round later)
            agen = sh.streams[epoch] = self.eng.stream_outputs(sh.scope, epoch, sh.tenant)

        async def pull():
            for _ in range(frames):
                try:
                    f, _ = await agen.__anext__()
                except StopAsyncIteration:
                    sh.finished.add(epoch)
                    return
                at = self.clock.now()
                self.counts["frames"] += 1
                call = sh.called.get(f.epoch)
                if f.token_ids and call is not None and at > call:
                    self.violations.append(f"{sh.scope[:20]}: {len(f.token_ids)} token(s) of epoch {f.epoch} "
                                           f"received after its SUPERSEDE was called")
                if f.revoked and f.epoch not in sh.called:
                    self.violations.append(f"{sh.scope[:20]}: epoch {f.epoch} ended revoked, but no SUPERSEDE of it "
                                           f"was ever called (a refused call changed something)")
                if f.token_ids and f.epoch in sh.cold and f.num_cached_tokens:
                    self.violations.append(f"{sh.scope[:20]}: cold epoch {f.epoch} read {f.num_cached_tokens} "
                                           f"prefix-cache tokens (vLLM's count)")
                if f.finished:
                    sh.finished.add(epoch)
                    return
        self.run(pull())

    @rule()
    def step(self):
        self.run(self.eng.backend.sched("ping"))  # answered between two engine steps

    @rule(key=scopes)
    def inject_generation_race(self, key):
        sh = self.shadow[key]
        if sh.armed:
            return
        self.run(GenerationRace(sh.scope, sh.tenant).inject(self.eng))  # healed by use (one-shot) or at teardown
        self.counts["faults"] += 1
        sh.armed = True

    # ------------------------------------------------------------------ invariants
    @invariant()
    def only_current_epochs_publish(self):
        assert not self.violations, self.violations
        assert self.eng.stats()["obsolete_tokens_published"] == 0

    @invariant()
    def one_current_version_per_scope(self):
        live = set(self.run(self.eng.backend.sched("audit"))["live_requests"])
        for (tenant, scope), sh in self.shadow.items():
            assert self.eng.current_epoch(scope, tenant) == sh.epoch, (scope[:20], sh.epoch)
            versions = self.eng.table.get(tenant, scope).versions
            stale = {v.internal_id for e, v in versions.items() if e < sh.epoch} & live
            assert not stale, f"{scope[:20]}: superseded versions still live in vLLM: {stale}"

    @invariant()
    def refcounts_pins_and_no_obsolete_execution(self):
        rep = self.run(self.eng.backend.sched("audit"))
        assert rep["valid"], rep["violations"]
        assert self.run(self.eng.backend.sched("stats"))["pins"] == 0

    def teardown(self):
        async def fin():
            for sh in self.shadow.values():
                if sh.armed:
                    await self.eng.backend.sched("disarm", {"scope": self.eng.table.key(sh.tenant, sh.scope)})
                for agen in sh.streams.values():
                    await agen.aclose()
            await self.eng.drain()
            rep = await self.eng.audit()   # drained: every block free, no pin, no live obsolete execution
            await self.eng.close()
            return rep
        rep = self.run(fin())
        assert rep["valid"] and not rep["live_requests"], rep
        RetireMachine.counts["schedules"] += 1  # one schedule explored to its end, every invariant held


def _profile() -> str:
    return settings._current_profile or "ci"


def _report(c: Counter, wall: float, violations: int, error: str | None) -> dict:
    doc = {"profile": _profile(), "schedules": c["schedules"], "supersedes": c["supersede"],
           "inherited": c["inherited"], "cold": c["cold"], "faults_injected": c["faults"],
           "concurrent": c["concurrent"], "truncations": c["truncation"], "refused": c["refused"],
           "dram": c["dram"], "frames": c["frames"], "violations": violations, "wall_s": round(wall, 1),
           "error": error}
    doc["line"] = (f"soak: {doc['schedules']} schedules, {doc['supersedes']} supersedes ({doc['inherited']} inherited"
                   f" / {doc['cold']} cold), {doc['faults_injected']} faults injected, {violations} violations, "
                   f"wall {wall:.0f} s")
    return doc


def test_retire_state_machine(unit):
    RetireMachine.counts.clear()
    t0 = time.monotonic()
    error = None
    try:
        run_state_machine_as_test(lambda: RetireMachine(unit))
    except BaseException as e:
        error = f"{type(e).__name__}: {str(e)[:2000]}"
        raise
    finally:
        c = RetireMachine.counts
        doc = _report(c, time.monotonic() - t0, 1 if error else 0, error)
        out = Path(__file__).resolve().parent.parent / "results" / f"stateful-{doc['profile']}.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(doc, indent=2))
        print(f"\n{doc['line']}\nstate machine counts: {dict(c)}")
    c = RetireMachine.counts
    assert c["supersede"] >= 20 and c["frames"] >= 20 and c["inherited"] >= 1 and c["cold"] >= 1, dict(c)
    assert c["concurrent"] >= 1 and c["truncation"] >= 1 and c["refused"] >= 1 and c["faults"] >= 1, dict(c)


def test_negative_control_state_machine_catches_a_leaked_pin(unit):
    """The refcount invariant must fail when a block reference leaks: pin a block behind the ledger's back."""
    machine = RetireMachine(unit)
    machine.first_scope(seed=1)
    machine.step()
    unit.run(unit.retire.backend.sched("leak_block_for_test", {"block_id": 5}))
    try:
        with pytest.raises(AssertionError, match=r"block 5 leaked: ref_cnt=\d+ accounted=\d+"):
            machine.refcounts_pins_and_no_obsolete_execution()
    finally:
        unit.run(unit.retire.backend.sched("leak_block_for_test", {"block_id": 5, "undo": True}))
    machine.teardown()


def test_negative_control_state_machine_catches_an_obsolete_frame(unit):
    """The publication invariant must fail when a consumer receives tokens of an epoch after its SUPERSEDE was
    called: the facade's gates are switched off, the old stream is pulled after the call."""
    machine = RetireMachine(unit)
    key = machine.first_scope(seed=2)
    sh = machine.shadow[key]
    machine.run(wait_engine(machine.eng, sh.scope, out_tokens=6, epoch=0, tenant=sh.tenant))
    machine.eng.seams.gates = False
    machine.supersede(key, keep=0.5, grow=10, quota=None, dram=False, forged=False)
    machine.consume(key, frames=1, old=True)  # tokens of epoch 0 queued before the call, received after it
    with pytest.raises(AssertionError, match="received after its SUPERSEDE was called"):
        machine.only_current_epochs_publish()
    machine.eng.seams.reset()
    machine.teardown()  # closes the ungated stream; drain() forgets the revoked version client-side
