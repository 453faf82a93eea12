"""RetireEngine: the public facade (RETIRE.md §5). One interface, three policies, one engine configuration.

Invariants:
- Every frame a consumer receives carries (scope, epoch), and its epoch is checked at dequeue (gate (c)).
- Under "retire" no token of epoch e is yielded after `supersede(e -> e+1)` was called and accepted: publication of e
  waits while the SUPERSEDE is in flight, gate (b) drops the old request from the output processor once the engine
  committed, gate (c) drops anything dequeued after that (retire/publication.py), and the engine commits nothing of
  e after its ADVANCE (gate (a)). `stats()["obsolete_tokens_published"]` counts violations and must stay 0.
- A call that raises changed nothing, on both sides: validation (scope, epoch, prompt, contract, vLLM's own input
  checks) completes before anything is sent; the engine's version table is the one commit point, and the scope
  table here mirrors it only after the engine accepted (a refused SUPERSEDE leaves the old version current and
  streaming, and the successor never existed). SUPERSEDEs of one scope are serialized; once the successor is sent,
  the transition completes even if the caller is cancelled.
- Identities are typed (`ScopeKey`, `VersionKey`): no tenant or scope string can alias another's.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections import Counter
from typing import AsyncIterator, Sequence

import msgspec

from .authority import Scope, ScopeTable, Version
from .align import common_prefix_len
from .backend import Backend
from .errors import (AuditFailed, EngineClosed, InvalidRequest, RetireError, StaleEpoch, SupersedeRefused,
                     UnknownScope, UnsupportedContract)
from .publication import publish
from .switches import TestSeams
from .types import (MODES, Contract, Frame, RequestTag, Supersede, Transition, TransitionResult, VersionKey,
                    encode)

POLICIES = ("retire", "native-cold", "native-prefix")
_ns = itertools.count()
now = time.monotonic
REFUSALS = {"unknown-scope": UnknownScope, "stale-epoch": StaleEpoch}


class RetireEngine:
    def __init__(self, model: str | None = None, policy: str = "retire", *, backend: Backend | None = None,
                 **engine_kwargs):
        if policy not in POLICIES:
            raise InvalidRequest(f"unknown policy {policy!r}; choose one of {POLICIES}")
        if backend is None:
            if model is None:
                raise InvalidRequest("RetireEngine needs a model path (or a backend to share)")
            backend = Backend(model, **engine_kwargs)
        elif engine_kwargs:
            raise InvalidRequest("engine kwargs cannot be given with a shared backend")
        self.policy = policy
        self.backend = backend
        backend.refs += 1
        self.table = ScopeTable(f"{policy}.{next(_ns)}.{uuid.uuid4().hex[:8]}")
        self.counters: Counter = Counter()
        self.closed = False
        self.seams = TestSeams()  # test-only switches and fault hooks (retire/switches.py); reset_seams() resets
        self._epoch_events: dict[tuple[str, str], asyncio.Event] = {}

    # ------------------------------------------------------------------ construction helpers
    def with_policy(self, policy: str) -> "RetireEngine":
        """A sibling facade with another policy on the same engine (same process, same configuration)."""
        self._check_open()
        return RetireEngine(policy=policy, backend=self.backend)

    # ------------------------------------------------------------------ validation
    def _check_open(self) -> None:
        if self.closed or self.backend.closed:
            raise EngineClosed("engine is closed")

    def _validate_prompt(self, prompt: Sequence[int]) -> list[int]:
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
            raise InvalidRequest("prompt must be a sequence of token ids")
        toks = list(prompt)
        if not toks:
            raise InvalidRequest("prompt is empty")
        if len(toks) >= self.backend.max_model_len:
            raise InvalidRequest(f"prompt has {len(toks)} tokens; max_model_len is {self.backend.max_model_len}")
        vocab = self.backend.vocab_size
        for t in toks:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
                raise InvalidRequest(f"token id {t!r} is outside the vocabulary [0, {vocab})")
        return toks

    def _validate_contract(self, contract: Contract) -> Contract:
        if not isinstance(contract, Contract):
            raise UnsupportedContract("contract must be a retire.Contract")
        c = contract.normalized()
        if c.mode not in MODES:
            raise UnsupportedContract(f"numerical mode {contract.mode!r} not in {MODES} (or 'ordinary')")
        if c.pin_quota_blocks is not None and c.pin_quota_blocks < 0:
            raise UnsupportedContract("pin_quota_blocks must be >= 0 or None")
        if c.dram_tier and not c.inherit:
            raise UnsupportedContract("dram_tier carries inherited state: it needs inherit=True")
        if isinstance(c.slack_tokens, bool) or not isinstance(c.slack_tokens, int) or c.slack_tokens <= 0:
            raise UnsupportedContract("slack_tokens must be a positive number of tokens")
        return c

    def _params(self, sampling_params, tag: RequestTag):
        from vllm import SamplingParams

        if not isinstance(sampling_params, SamplingParams):
            raise InvalidRequest("sampling_params must be a vllm.SamplingParams")
        if sampling_params.n != 1:
            raise InvalidRequest("retire supports n == 1 per version")
        sp = sampling_params.clone()
        sp.output_kind = self.backend.fe.output_kind_delta()
        sp.extra_args = dict(sp.extra_args or {}, retire=encode(tag))
        return sp

    def _prompt(self, toks: list[int], cache_salt: str | None = None) -> dict:
        p: dict = {"prompt_token_ids": toks}
        if cache_salt is not None:
            p["cache_salt"] = cache_salt
        if self.policy == "native-cold":
            p["cache_salt"] = f"cold-{uuid.uuid4().hex}"  # guarantees no prefix reuse
        return p

    # ------------------------------------------------------------------ API
    async def submit(self, scope: str, prompt_token_ids: Sequence[int], sampling_params, tenant: str = "default",
                     *, cache_salt: str | None = None, contract: Contract | None = None) -> int:
        """Start scope `scope` at epoch 0. `cache_salt` puts its KV in a private prefix-cache namespace (vLLM's
        cache_salt); a successor with another salt cannot inherit (config mismatch). `contract` is the version's own
        contract as a future predecessor: today its revision slack (`Contract(slack=True)`), which the engine must
        know from the version's first step."""
        self._check_open()
        _check_names(tenant, scope)
        toks = self._validate_prompt(prompt_token_ids)
        slack = self._validate_contract(contract).revision_slack() if contract is not None else None
        if self.policy == "retire" and self.backend.safe_points is None:
            await self.backend.ensure_safe_points()
        self.table.check_new(tenant, scope)
        key = VersionKey(self.table.key(tenant, scope), 0)
        tag = RequestTag(key, self.policy, slack=slack if self.policy == "retire" else None)
        prep = await self.backend.prepare(key.request_id(), self._prompt(toks, cache_salt),
                                          self._params(sampling_params, tag))
        self.table.check_new(tenant, scope)  # another submit of this scope may have run while vLLM validated
        v = Version(scope, tenant, 0, key, toks, prep.internal_id, prep.collector, t_submit=now())
        self.table.create(tenant, scope, v)
        await self.backend.send(prep)
        self.counters["submitted"] += 1
        return 0

    async def supersede(self, scope: str, expected_epoch: int, prompt_token_ids: Sequence[int], sampling_params,
                        contract: Contract = Contract(), tenant: str = "default", *,
                        cache_salt: str | None = None) -> Transition:
        """SUPERSEDE(scope, expected_epoch -> expected_epoch + 1, prompt, contract). Returns once the successor is
        admitted (before its first token). Raises SupersedeRefused / InvalidRequest and then changed nothing."""
        t_call = now()
        self._check_open()
        try:
            _check_names(tenant, scope)
            s = self.table.check(tenant, scope, expected_epoch)
            toks = self._validate_prompt(prompt_token_ids)
            contract = self._validate_contract(contract)
        except RetireError:
            self.counters["refused"] += 1
            raise
        held = s.current
        held.hold()  # synchronously at the call: nothing of this version is published until the engine's verdict
        try:
            return await self._supersede_locked(s, tenant, scope, expected_epoch, toks, sampling_params, contract,
                                                cache_salt, t_call)
        finally:
            held.unhold()

    async def _supersede_locked(self, s: Scope, tenant: str, scope: str, expected_epoch: int, toks: list[int],
                                sampling_params, contract: Contract, cache_salt, t_call: float) -> Transition:
        async with s.lock:  # SUPERSEDEs of one scope are serialized: of two with one expected epoch, one wins
            try:
                self.table.check(tenant, scope, expected_epoch)
            except RetireError:
                self.counters["refused"] += 1
                raise
            key = VersionKey(self.table.key(tenant, scope), expected_epoch + 1)
            posted = self._will_post(s.current) if self.policy == "retire" else None
            retire = self.policy == "retire"
            tag = RequestTag(key, self.policy, Supersede(expected_epoch, contract, posted) if retire else None,
                             contract.revision_slack() if retire else None)
            if self.seams.successor_tenant is not None:  # ForgedTenant: the successor names another tenant's scope
                tag = msgspec.structs.replace(tag, key=VersionKey(self.table.key(self.seams.successor_tenant, scope),
                                                                  key.epoch))
            prep = await self.backend.prepare(key.request_id(), self._prompt(toks, cache_salt),
                                              self._params(sampling_params, tag))
            succ = Version(scope, tenant, key.epoch, key, toks, prep.internal_id, prep.collector)
            run = self._commit_retire if self.policy == "retire" else self._commit_native
            task = asyncio.ensure_future(run(s, succ, prep, tag, contract, t_call))
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:  # the successor was sent: finish the transition under the lock
                with contextlib.suppress(BaseException):
                    await task
                raise

    async def _commit_retire(self, s: Scope, succ: Version, prep, tag: RequestTag, contract: Contract,
                             t_call: float) -> Transition:
        old = s.current
        if tag.supersede.posted is not None:
            self._post_revocation(old, succ.prompt, contract)
        old.hold()  # (the caller's hold ends when the call returns; this one when the verdict is mirrored)
        try:
            await self.backend.send(prep)
            res = await self.backend.result(tag.key)
            if res is None or res.refused:
                self.backend.drop_local(prep.internal_id)  # the successor never existed
                self.counters["refused"] += 1
                raise REFUSALS.get(res.refused_kind if res else None, SupersedeRefused)(
                    f"engine refused the SUPERSEDE: {res.refused if res else 'no result'}")
            self.table.advance(s, tag.supersede.expected_epoch, succ)  # mirror the engine's ADVANCE
            if self.seams.gates:
                self.backend.drop_local(old.internal_id)  # gate (b)
        finally:
            old.unhold()
        succ.t_submit = now()
        self._advanced(s)
        tr = self._retire_transition(s.scope, succ.epoch, res, t_call)
        if contract.digests and tr.certificate is not None:
            ids = [b for g in tr.certificate.block_ids for b in g]
            digests = (await self.backend.worker("retire_block_digests", ids))[0]
            tr.certificate = msgspec.structs.replace(tr.certificate, digests=tuple(digests))
        from .dram import frontend as dram
        tr = await dram.after_supersede(self, s.tenant, tr, res)  # DRAM tier; stale DRAM copies
        return self._record(s, succ, tr)

    def _will_post(self, old: Version) -> str | None:
        """The request id this SUPERSEDE will revoke in the mailbox (safe points active, the old version running)."""
        sp = self.backend.safe_points
        return old.internal_id if sp and sp["active"] and not old.finished and self.seams.safe_points else None

    def _post_revocation(self, old: Version, toks: list[int], contract: Contract) -> None:
        """Mailbox first: a step of the old version running right now sees the revocation at its next safe point,
        before the engine loop (blocked on that step) can read the SUPERSEDE. A contract that can inherit nothing
        (inherit=False, a zero pin quota) makes the whole running chunk obsolete: the cost model then sees lcp 0.
        The engine retires the entry when it processes the SUPERSEDE, accepted or refused."""
        reusable = contract.inherit and contract.pin_quota_blocks != 0
        self.backend.mailbox.post(old.internal_id, common_prefix_len(old.prompt, toks) if reusable else 0, len(toks))

    async def _commit_native(self, s: Scope, succ: Version, prep, tag, contract, t_call: float) -> Transition:
        old = self.table.advance(s, tag.key.epoch - 1, succ)
        t_adv = now()
        self._advanced(s)
        await self.backend.abort(old.internal_id)
        succ.t_submit = now()
        await self.backend.send(prep)
        closed = await self.backend.sched("closed_at", {"req_ids": [old.internal_id]})
        t_closed = closed.get(old.internal_id)
        cold = self.policy == "native-cold"
        tr = Transition(s.scope, succ.epoch, self.policy, 0 if cold else None, None,
                        "native abort: no certified handoff" if cold else None,
                        {"advance": t_adv - t_call, "admit": now() - t_call},
                        fence_latency=(max(0.0, t_closed - t_call) if t_closed else 0.0), t_call=t_call)
        return self._record(s, succ, tr)

    def _advanced(self, s: Scope) -> None:
        ev = self._epoch_events.pop((s.tenant, s.scope), None)
        if ev is not None:
            ev.set()

    def _record(self, s: Scope, succ: Version, tr: Transition) -> Transition:
        succ.transition = tr
        s.transitions.append(tr)
        self.counters["supersedes"] += 1
        return tr

    def _retire_transition(self, scope: str, epoch: int, res: TransitionResult, t_call: float) -> Transition:
        timings = dict(res.timings)
        timings["admit"] = now() - t_call
        tr = Transition(scope, epoch, "retire", res.inherited_tokens, res.certificate, res.cold_reason, timings,
                        res.receipts, fence_latency=(res.fence_closed_at - t_call) if res.fence_closed_at else None,
                        t_call=t_call)
        self.counters["inherited_tokens"] += tr.inherited_tokens
        self.counters["cold" if not tr.inherited_tokens else "inherited"] += 1
        return tr

    async def stream(self, scope: str, epoch: int | None = None, tenant: str = "default") -> AsyncIterator[Frame]:
        """Yield one version's frames. A revoked version ends with one empty Frame(revoked=True, finished=True).
        Closing this stream closes the inner one at once (the version's consumer slot is free again)."""
        async with contextlib.aclosing(self.stream_outputs(scope, epoch, tenant)) as items:
            async for frame, _ in items:
                yield frame

    async def stream_outputs(self, scope: str, epoch: int | None = None,
                             tenant: str = "default") -> AsyncIterator[tuple[Frame, object | None]]:
        """Like `stream`, but each item is `(frame, output)`: `output` is vLLM's own `RequestOutput` (DELTA) behind
        the frame, for a server that formats vLLM's responses (text, finish reasons); it is None for the empty
        revoked end frame. Same gates, same single-consumer rule."""
        self._check_open()
        s = self.table.get(tenant, scope)
        v = s.versions.get(s.epoch if epoch is None else epoch)
        if v is None:
            raise InvalidRequest(f"scope {scope!r} has no epoch {epoch}")
        if v.consumers:
            raise InvalidRequest(f"scope {scope!r} epoch {v.epoch} already has a consumer")
        v.consumers += 1
        try:
            async with contextlib.aclosing(publish(self, v)) as items:
                async for item in items:
                    yield item
        finally:
            v.consumers -= 1

    async def wait_epoch(self, scope: str, epoch: int, tenant: str = "default") -> None:
        """Barrier: return once `epoch` (or a later one) is current for the scope (set at ADVANCE)."""
        while self.table.get(tenant, scope).epoch < epoch:
            ev = self._epoch_events.setdefault((tenant, scope), asyncio.Event())
            await ev.wait()

    def transitions(self, scope: str, tenant: str = "default") -> list[Transition]:
        return list(self.table.get(tenant, scope).transitions)

    def current_epoch(self, scope: str, tenant: str = "default") -> int:
        return self.table.get(tenant, scope).epoch

    def internal_id(self, scope: str, epoch: int | None = None, tenant: str = "default") -> str:
        s = self.table.get(tenant, scope)
        return s.versions[s.epoch if epoch is None else epoch].internal_id

    def stats(self) -> dict:
        c = Counter({"obsolete_tokens_published": 0, "obsolete_frames_suppressed": 0, "supersedes": 0})
        c.update(self.counters)
        return dict(c)

    async def audit(self) -> dict:
        """Invariant report; raises AuditFailed on a violation. Engine side: refcounts of every block, pins, live
        obsolete executions. Frontend side: no revoked version still registered in the output processor, at most one
        live version per scope."""
        self._check_open()
        rep = await self.backend.sched("audit")
        violations = list(rep["violations"])
        for s in self.table.scopes.values():
            live = [v.epoch for v in s.versions.values() if not v.finished and not v.revoked]
            if len(live) > 1:
                violations.append(f"scope {s.scope!r} has {len(live)} live current versions")
            for v in s.versions.values():
                if v.revoked and self.backend.registered(v.internal_id):
                    violations.append(f"revoked version {v.external_id} still registered client-side")
        rep = dict(rep, violations=violations, valid=not violations)
        if violations:
            raise AuditFailed(rep)
        return rep

    async def drain(self) -> None:
        """Consume and drop every unfinished, unconsumed version's output (used between tests and at close).
        A version that still has a consumer is left to it."""
        for v in list(self.table.live_versions()):
            if v.consumers:
                continue
            if v.revoked:
                if self.backend.registered(v.internal_id):
                    self.backend.drop_local(v.internal_id)  # gates were off (negative control): forget it now
                v.finished = True
                continue
            async for _ in self.stream(v.scope, v.epoch, v.tenant):
                pass

    @property
    def engine_client(self):
        """The vLLM `EngineClient` (AsyncLLM) this facade runs on, for code that builds on vLLM's own serving layer
        (model config, renderer, tokenizer, health, metrics, unscoped requests). Requests for scopes must go through
        the facade. A closed facade raises EngineClosed."""
        self._check_open()
        return self.backend.llm

    async def cancel(self, scope: str, epoch: int | None = None, tenant: str = "default") -> None:
        """End the current version of a scope as vLLM ends a request whose client went away (an ABORT; the scope
        keeps its epoch, and a later SUPERSEDE of it starts from a finished predecessor). Refused with `StaleEpoch`
        if `epoch` is given and is no longer current, so a cancel can never overtake a SUPERSEDE."""
        self._check_open()
        s = self.table.get(tenant, scope)
        if epoch is not None and epoch != s.epoch:
            raise StaleEpoch(f"scope {scope!r}: cancel of epoch {epoch}, current is {s.epoch}")
        v = s.current
        if not v.finished:
            await self.backend.abort(v.internal_id)
            self.counters["cancelled"] += 1

    async def reset_seams(self) -> None:
        """Restore every test switch and fault hook to production behaviour: this facade's, and the engine's (shared
        by sibling facades: gate (a), writer closure, armed one-shot hooks)."""
        self.seams.reset()
        await self.backend.sched("reset_switches")

    async def close(self) -> None:
        if self.closed:
            return
        for v in list(self.table.live_versions()):
            if not v.revoked:
                await self.backend.abort(v.internal_id)
            v.finished = True
        self.closed = True
        self.backend.refs -= 1
        if self.backend.refs == 0:
            await self.backend.stop()


def _check_names(tenant, scope) -> None:
    """Any string is a valid tenant or scope name ("/", "#", unicode, long); it must be encodable."""
    for what, x in (("tenant", tenant), ("scope", scope)):
        if not isinstance(x, str):
            raise InvalidRequest(f"{what} must be a str, got {type(x).__name__}")
        try:
            x.encode()
        except UnicodeEncodeError as e:
            raise InvalidRequest(f"{what} is not valid unicode: {e}") from e
