"""Safe points inside model execution (worker side): bounded retirement of a long step.

Invariants:
- Checks are armed only for steps of at least `min_tokens` scheduled tokens, in eager mode (per-layer hooks fire
  unreliably in compiled graphs: there we log once and fall back to the step boundary). The layer hooks exist only
  while an armed step runs (registered at its start, removed at its end), so unarmed steps, every decode step among
  them, pay one integer comparison and run the layers on PyTorch's hook-free call path.
- At every decoder layer of an armed step the worker reads the revocation mailbox. It cuts the step only when EVERY
  request in it is revoked (a mixed step is never cut: other scopes' results must not change) and the cost model says
  the successor gets its first token earlier by cutting than by finishing the step.
- A revocation is matched by the mailbox key of the request id (a digest of the whole id, retire/mailbox.py).
- Safe points run inside the worker's one step wrapper (retire/worker_step.py).
- A cut never lets the exception escape the worker: `execute_model` returns a ModelRunnerOutput that lists every
  scheduled request with no sampled token, plus `retire_cut` = {req_id: (chunk_start, chunk_len)} and the decision;
  the scheduler closes the writers (rollback, evict the chunk's half-written blocks) when it commits that output.
- The decision (cut or finish) and its predicted times are written to the mailbox's decision log either way, so the
  FENCE receipt can record them.

Cost model (all times predicted from this step's own measured layer times):
  per-layer time t = elapsed / layers_done; step time S = t * L; per-token prefill cost c = S / n.
  finish: remaining = t * (L - k); the successor then computes len(new) - certified_after_finish tokens.
  cut:    ~0 wait;                   the successor computes len(new) - certified_after_cut tokens.
  certified_* = min(lcp, frontier) rounded down to the block, frontier = chunk end (finish) or chunk start (cut).
  Cut iff c * (extra tokens the successor must recompute after a cut) < remaining.
"""
from __future__ import annotations

import json
import logging
import time

from . import adapter
from .mailbox import key as mailbox_key

log = logging.getLogger("retire.safepoints")


class _Cut(Exception):
    pass


def decide(*, chunk: tuple[int, int], lcp: int, new_len: int, block: int, elapsed: float, layers_done: int,
           layers: int) -> dict:
    """The cut-or-finish cost model (pure; unit-tested). Returns the decision with its predicted times."""
    s, n = chunk
    e = s + n
    t = elapsed / max(layers_done, 1)
    remaining = t * (layers - layers_done)
    c = (t * layers) / max(n, 1)
    cert_cut = min(lcp, s) // block * block
    cert_fin = min(lcp, e) // block * block
    t_cut = c * max(new_len - cert_cut, 0)
    t_fin = remaining + c * max(new_len - cert_fin, 0)
    return {"cut": t_cut < t_fin, "layer": layers_done, "chunk": [s, n], "lcp": lcp,
            "predicted_successor_ready_cut": t_cut, "predicted_successor_ready_finish": t_fin,
            "remaining_step": remaining, "per_token_cost": c}


class SafePoints:
    def __init__(self, worker, mailbox, min_tokens: int, block: int):
        self.wk = adapter.worker()
        self.worker, self.mb, self.min_tokens, self.block = worker, mailbox, min_tokens, block
        self.layers = self.wk.decoder_layers(worker)
        self.hooks = [self._hook(i) for i in range(len(self.layers))]
        self.armed = None
        self.installed = False

    def install(self, wrapper=None) -> bool:
        """Attach to the worker's one step wrapper (retire/worker_step.py), in eager mode only."""
        if not self.wk.eager(self.worker):
            log.warning("retire: per-layer safe points need enforce_eager=True (compiled graphs fire layer hooks "
                        "unreliably); FENCE falls back to the step boundary")
            return False
        if wrapper is None:
            from .worker_step import StepWrapper
            wrapper = StepWrapper.of(self.worker)
        wrapper.attach(safe_points=self)
        self.installed = True
        return True

    def run(self, orig, so, *args, **kwargs):
        if self.wk.total_tokens(so) < self.min_tokens:
            return orig(so, *args, **kwargs)  # unarmed: no hook on any layer
        chunks = self.wk.chunks_of(so)
        self.armed = {"chunks": chunks, "keys": {r: mailbox_key(r) for r in chunks}, "t0": time.monotonic(),
                      "decided": False}
        handles = [layer.register_forward_pre_hook(h) for layer, h in zip(self.layers, self.hooks)]
        try:
            return orig(so, *args, **kwargs)
        except _Cut:
            a = self.armed
            return self.wk.cut_output(so, {"chunks": a["cut"], "decision": a["decision"]})
        finally:
            for h in handles:
                h.remove()
            self.armed = None

    def _hook(self, i: int):
        def pre_hook(module, args):
            a = self.armed  # hooks are registered only while an armed step runs, so this is never None here
            if a["decided"]:
                return None
            self.mb.worker_pause_point(i, a["keys"].values())
            self.mb.bump("checks")
            revoked = self.mb.revoked() if self.mb.any_live() else {}
            if revoked:
                self._check(i, a, revoked)
            return None
        return pre_hook

    def _check(self, i: int, a: dict, revoked: dict) -> None:
        ids, keys = a["chunks"], a["keys"]
        hit = [r for r in ids if keys[r] in revoked]
        if not hit:
            return
        if len(hit) != len(ids):  # mixed step: fence at the step boundary, never cut others' work
            a["decided"] = True
            self._log({"cut": False, "path": "step-boundary:mixed", "layer": i, "req_ids": hit})
            return
        # every request of the step is revoked: decide per the cost model on the longest chunk
        rid = max(hit, key=lambda r: ids[r][1])
        lcp, new_len = revoked[keys[rid]]
        d = decide(chunk=ids[rid], lcp=lcp, new_len=new_len, block=self.block,
                   elapsed=time.monotonic() - a["t0"], layers_done=i, layers=len(self.layers)) if i else \
            {"cut": True, "layer": 0, "chunk": list(ids[rid]), "lcp": lcp, "reason": "before the first layer"}
        if lcp >= ids[rid][0] + ids[rid][1] and i:
            d["cut"] = False  # the whole chunk is shared with the successor: useful work, let it finish
        a["decided"] = True
        d["path"] = "safe-point" if d["cut"] else "finish-step"
        d["req_ids"] = hit
        self._log(d)
        if d["cut"]:
            a["cut"] = {r: list(ids[r]) for r in ids}
            a["decision"] = d
            self.mb.bump("cuts")
            raise _Cut()

    def _log(self, d: dict) -> None:
        self.mb.write_log(json.dumps(d, default=float))
