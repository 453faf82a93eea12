"""RetireEngine: the public facade (RETIRE.md §5). One interface, three policies, one engine configuration.

Invariants:
- Every frame a consumer receives carries (scope, epoch), and its epoch is checked at dequeue (gate (c)).
- Under "retire" no token of epoch e is yielded after `supersede(e -> e+1)` was called: gate (b) drops the old request
  from the output processor at ADVANCE, gate (c) drops anything already dequeued-but-not-yielded, and the engine-side
  transition (gate (a)) commits nothing of e after the step boundary. `stats()["obsolete_tokens_published"]` counts
  violations and must stay 0 under "retire"; under the native policies it measures the problem.
- A call that raises changed nothing: validation (scope, epoch, prompt, contract, vLLM's own input checks) completes
  before ADVANCE.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import uuid
from collections import Counter
from typing import AsyncIterator, Sequence

from .authority import Scope, ScopeTable, Version
from .align import common_prefix_len
from .backend import Backend
from .errors import (AuditFailed, EngineClosed, InvalidRequest, RetireError, SupersedeRefused,
                     UnsupportedContract)
from .types import MODES, Certificate, Contract, Frame, Receipt, Transition

POLICIES = ("retire", "native-cold", "native-prefix")
_ns = itertools.count()
now = time.monotonic


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
        self._owner = backend.refs == 1
        self.table = ScopeTable(f"{policy}.{next(_ns)}.{uuid.uuid4().hex[:6]}")
        self.counters: Counter = Counter()
        self.closed = False
        self.test_switches: dict = {}  # test-only: {"gates": False} disables gates (b)+(c) for negative controls
        # Fault seams (retire/faults): async callables. on_dequeue(eng, version, output) -> output runs between
        # dequeue and the epoch check; after_yield(eng, frame) runs after the consumer got a frame.
        self.hooks: dict[str, list] = {"on_dequeue": [], "after_yield": []}
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
        return c

    def _params(self, sampling_params, meta: dict):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if not isinstance(sampling_params, SamplingParams):
            raise InvalidRequest("sampling_params must be a vllm.SamplingParams")
        if sampling_params.n != 1:
            raise InvalidRequest("retire supports n == 1 per version")
        sp = sampling_params.clone()
        sp.output_kind = RequestOutputKind.DELTA
        sp.extra_args = dict(sp.extra_args or {}, retire=meta)
        return sp

    def _prompt(self, toks: list[int], epoch: int, key: str, cache_salt: str | None = None) -> dict:
        p: dict = {"prompt_token_ids": toks}
        if cache_salt is not None:
            p["cache_salt"] = cache_salt
        if self.policy == "native-cold":
            p["cache_salt"] = f"cold:{key}#{epoch}:{uuid.uuid4().hex[:8]}"  # guarantees no prefix reuse
        return p

    # ------------------------------------------------------------------ API
    async def submit(self, scope: str, prompt_token_ids: Sequence[int], sampling_params, tenant: str = "default",
                     *, cache_salt: str | None = None) -> int:
        """Start scope `scope` at epoch 0. `cache_salt` puts its KV in a private prefix-cache namespace (vLLM's
        cache_salt); a successor with another salt cannot inherit (config mismatch)."""
        self._check_open()
        toks = self._validate_prompt(prompt_token_ids)
        if self.policy == "retire" and self.backend.safe_points is None:
            await self.backend.ensure_safe_points()
        if (tenant, scope) in self.table.scopes:
            self.table.create(tenant, scope, None)  # raises ScopeExists
        key = self.table.engine_key(tenant, scope)
        meta = {"scope": key, "epoch": 0, "tenant": tenant, "policy": self.policy}
        prep = await self.backend.prepare(f"{key}#0", self._prompt(toks, 0, key, cache_salt),
                                          self._params(sampling_params, meta))
        v = Version(scope, tenant, 0, f"{key}#0", toks, prep.internal_id, prep.collector, t_submit=now())
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
            s = self.table.check(tenant, scope, expected_epoch)
            toks = self._validate_prompt(prompt_token_ids)
            contract = self._validate_contract(contract)
        except RetireError:
            self.counters["refused"] += 1
            raise
        key = self.table.engine_key(tenant, scope)
        epoch = expected_epoch + 1
        meta = {"scope": key, "epoch": epoch, "tenant": tenant, "policy": self.policy}
        if self.policy == "retire":
            meta.update(supersede=True, expected_epoch=expected_epoch, contract=contract.to_wire())
            forged = self.test_switches.get("successor_tenant")
            if forged is not None:
                meta["tenant"] = forged
        prep = await self.backend.prepare(f"{key}#{epoch}", self._prompt(toks, epoch, key, cache_salt),
                                          self._params(sampling_params, meta))
        succ = Version(scope, tenant, epoch, f"{key}#{epoch}", toks, prep.internal_id, prep.collector)
        # ADVANCE (frontend linearization point)
        old = self.table.advance(s, expected_epoch, succ)
        t_adv = now()
        ev = self._epoch_events.pop((tenant, scope), None)
        if ev is not None:
            ev.set()
        if self.policy == "retire":
            if self.backend.safe_points and self.backend.safe_points["active"] and not old.finished \
                    and self.test_switches.get("safe_points", True):
                # mailbox first: a step of the old version running right now sees the revocation at its next
                # safe point, before the engine loop (blocked on that step) can read the SUPERSEDE.
                # A contract that can inherit nothing (inherit=False, a zero pin quota) makes the whole running
                # chunk obsolete: the cost model then sees lcp 0 and cuts.
                reusable = contract.inherit and contract.pin_quota_blocks != 0
                lcp = common_prefix_len(old.prompt, toks) if reusable else 0
                self.backend.mailbox.post(old.internal_id, lcp, len(toks))
            if self.test_switches.get("gates", True):
                self.backend.drop_local(old.internal_id)  # gate (b)
            succ.t_submit = now()
            await self.backend.send(prep)
            res = await self.backend.sched("result", {"key": f"{key}#{epoch}"})
            tr = self._retire_transition(scope, epoch, res, t_call, t_adv)
            if contract.digests and tr.certificate is not None:
                ids = [b for g in tr.certificate.block_ids for b in g]
                digests = (await self.backend.worker("retire_block_digests", ids))[0]
                tr.certificate = dataclasses.replace(tr.certificate, digests=tuple(digests))
            from . import dram
            tr = await dram.after_supersede(self, scope, tenant, epoch, tr, res)  # DRAM tier; stale DRAM copies
        else:
            await self.backend.abort(old.internal_id)
            succ.t_submit = now()
            await self.backend.send(prep)
            closed = await self.backend.sched("closed_at", {"req_ids": [old.internal_id]})
            t_closed = closed.get(old.internal_id)
            inherited = 0 if self.policy == "native-cold" else None  # native-prefix: known at first frame
            tr = Transition(scope, epoch, self.policy, inherited, None,
                            "native abort: no certified handoff" if self.policy == "native-cold" else None,
                            {"advance": t_adv - t_call, "admit": now() - t_call},
                            fence_latency=(max(0.0, t_closed - t_call) if t_closed else 0.0), t_call=t_call)
        succ.transition = tr
        s.transitions.append(tr)
        self.counters["supersedes"] += 1
        return tr

    def _retire_transition(self, scope: str, epoch: int, res: dict | None, t_call: float, t_adv: float) -> Transition:
        if res is None or res.get("refused"):
            raise RetireError(f"engine refused a SUPERSEDE the frontend accepted: {res}")  # frontend/engine disagree
        timings = dict(res.get("timings", {}))
        timings["advance_frontend"] = t_adv - t_call
        timings["admit"] = now() - t_call
        cert = Certificate.from_wire(res.get("certificate"))
        receipts = tuple(Receipt(**r) for r in res.get("receipts", ()))
        fence = res.get("fence_closed_at")
        tr = Transition(scope, epoch, "retire", int(res.get("inherited_tokens", 0)), cert, res.get("cold_reason"),
                        timings, receipts, fence_latency=(fence - t_call) if fence else None, t_call=t_call)
        self.counters["inherited_tokens"] += tr.inherited_tokens
        self.counters["cold" if not tr.inherited_tokens else "inherited"] += 1
        return tr

    async def stream(self, scope: str, epoch: int | None = None, tenant: str = "default") -> AsyncIterator[Frame]:
        """Yield one version's frames. A revoked version ends with one empty Frame(revoked=True, finished=True)."""
        async for frame, _ in self.stream_outputs(scope, epoch, tenant):
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
            async for item in self._stream(v):
                yield item
        finally:
            v.consumers -= 1

    async def _stream(self, v: Version) -> AsyncIterator[tuple[Frame, object | None]]:
        scope = v.scope
        gated = self.policy == "retire" and self.test_switches.get("gates", True)
        while not v.finished:
            q = v.collector
            if gated and v.revoked:  # gate (c) before blocking: count what was queued, publish nothing
                self._suppress(q.get_nowait())
                yield self._end_revoked(v), None
                return
            out = q.get_nowait() or await q.get()
            for hook in self.hooks["on_dequeue"]:
                out = await hook(self, v, out)
            co = out.outputs[0] if out.outputs else None
            toks = tuple(co.token_ids) if co is not None else ()
            aborted = co is not None and co.finish_reason == "abort"
            if gated and v.revoked:  # gate (c): the frame reached dequeue after ADVANCE
                self._suppress(out)
                yield self._end_revoked(v), None
                return
            if toks:
                v.tokens_out += len(toks)
                if v.revoked:
                    v.obsolete_published += len(toks)
                    self.counters["obsolete_tokens_published"] += len(toks)
                    self.counters["obsolete_frames_published"] += 1
                tr = v.transition
                if tr is not None and tr.successor_ttft is None:
                    tr.successor_ttft = now() - tr.t_call
                    if tr.inherited_tokens is None:
                        tr.inherited_tokens = int(out.num_cached_tokens or 0)
            lps = top = None
            if co is not None and co.logprobs:
                lps = tuple(float(d[t].logprob) for t, d in zip(toks, co.logprobs))
                top = tuple({int(k): float(x.logprob) for k, x in d.items()} for d in co.logprobs)
            finished = bool(out.finished)
            if finished:
                v.finished = True
            if toks or finished:
                frame = Frame(scope, v.epoch, toks, finished and not aborted, revoked=v.revoked and aborted,
                              logprobs=lps, num_cached_tokens=out.num_cached_tokens, top_logprobs=top)
                yield frame, out
                for hook in self.hooks["after_yield"]:
                    await hook(self, frame)
            if aborted and toks:
                yield self._end_revoked(v), None

    def _suppress(self, out) -> None:
        if out is None:
            return
        n = sum(len(o.token_ids) for o in out.outputs)
        self.counters["obsolete_frames_suppressed"] += 1
        self.counters["obsolete_tokens_suppressed"] += n

    def _end_revoked(self, v: Version) -> Frame:
        v.finished = True
        return Frame(v.scope, v.epoch, (), finished=True, revoked=True)

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
        op = self.backend.llm.output_processor
        for s in self.table.scopes.values():
            live = [v.epoch for v in s.versions.values() if not v.finished and not v.revoked]
            if len(live) > 1:
                violations.append(f"scope {s.scope!r} has {len(live)} live current versions")
            for v in s.versions.values():
                if v.revoked and v.internal_id in op.request_states:
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
                if v.internal_id in self.backend.llm.output_processor.request_states:
                    self.backend.drop_local(v.internal_id)  # gates were off (negative control): forget it now
                v.finished = True
                continue
            async for _ in self.stream(v.scope, v.epoch, v.tenant):
                pass

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
            self.backend.shutdown()
