"""Safe points inside model execution (worker side): bounded retirement of a long step.

Invariants:
- Checks are armed only for steps of at least `min_tokens` scheduled tokens, in eager mode (per-layer hooks fire
  unreliably in compiled graphs: there we log once and fall back to the step boundary). The hooks exist only while an
  armed step runs (registered at its start, removed at its end), so unarmed steps, every decode step among them, pay
  one integer comparison and run the layers on PyTorch's hook-free call path.
- Safe points of an armed step: the start of every decoder layer and of its MLP, and, in a step of at least the
  tier's `min_tokens` tokens on a kernel whose split is bit-identical (retire/slicing.py), between the query slices
  of every layer's attention and between the row slices of every layer's MLP (retire/mlp_split.py, on a kernel whose
  row split is bit-identical at the tier's row count). The tier (static, or fine while revisions arrive) is chosen
  once, at the step's start (retire/density.py) and recorded in the decision. At each safe point the worker reads
  the revocation mailbox.
- A step holding a revoked request is cut only when the cost model (`decide`) predicts the successor's first token
  earlier by cutting, counting the work every OTHER request of the step loses: the whole chunk of each innocent is
  recomputed in the next step (`innocent_tokens`). So a mixed step is cut when its obsolete remainder outweighs the
  innocents' lost work; otherwise it finishes (path "step-boundary:mixed", or "finish-step" when alone). A chunk that
  is wholly shared with the successor is never cut (useful work), at every safe point including the first.
- A revocation is matched by the mailbox key of the request id (a digest of the whole id, retire/mailbox.py).
- A cut never lets the exception escape the worker: `execute_model` returns a ModelRunnerOutput that lists every
  scheduled request with no sampled token, plus `retire_cut` = {chunks: {req_id: (start, n)}, decision}; the
  scheduler's writer closure (retire/closure.py) rolls EVERY request of the step back exactly and re-runs the
  innocents next step.
- The decision (cut or finish), both predictions and the innocents' cost are written to the mailbox's decision log
  either way, so the FENCE receipt can record them. Time the worker spends held at a test barrier is not counted.

Cost model (pure, `decide`; all times from this step's own progress):
  progress p = fraction of the step done; step time S = elapsed / p; per-token cost c = S / N (N = step tokens).
  finish: the rest of the step, R = S (1 - p), then the successor computes len(new) - certified_after_finish tokens.
  cut:    the innocents recompute their whole chunks (c * innocent_tokens) with the successor's
          len(new) - certified_after_cut tokens.
  Cut iff c * (innocent_tokens + len(new) - cert_cut) < R + c * (len(new) - cert_fin), i.e. iff the obsolete
  remainder R * (obsolete / N) exceeds the innocents' lost work S * p * (innocent / N) plus the extra recompute.
  The decision depends on p only (c cancels), so it is defined at the first layer too; the predicted times need S,
  which before any progress comes from the last armed step's per-token cost (else relative units, `units`).
"""
from __future__ import annotations

import json
import logging
import time

from . import adapter
from .density import STATIC, Density
from .mailbox import key as mailbox_key

log = logging.getLogger("retire.safepoints")

#: the share of a decoder layer's time its attention takes, for the progress estimate of a step with no completed
#: layer yet (attention dominates long prefills on CPU; from the second layer on, measured layer times are used)
ATTENTION_SHARE = 0.85


class _Cut(Exception):
    pass


def decide(*, chunk: tuple[int, int], lcp: int, new_len: int, block: int, elapsed: float, progress: float,
           step_tokens: int | None = None, innocent_tokens: int = 0, per_token_cost: float | None = None) -> dict:
    """The cut-or-finish cost model (pure; unit-tested). `chunk` is the governing revoked request's (start, n);
    `step_tokens` all tokens of the step (default n); `innocent_tokens` those of requests not revoked."""
    s, n = chunk
    e = s + n
    total = max(int(step_tokens if step_tokens is not None else n), 1)
    p = min(max(progress, 0.0), 0.999)
    units = "s"
    if p > 0 and elapsed > 0:
        step = elapsed / p
    elif per_token_cost:
        step = per_token_cost * total
    else:
        step, units = 1.0, "step"  # relative: the decision does not depend on the scale
    c = step / total
    remaining = step * (1 - p)
    cert_cut = min(lcp, s) // block * block
    cert_fin = min(lcp, e) // block * block
    t_cut = c * (innocent_tokens + max(new_len - cert_cut, 0))
    t_fin = remaining + c * max(new_len - cert_fin, 0)
    useful = lcp >= e  # the whole chunk is shared with the successor: never cut useful work
    return {"cut": (t_cut < t_fin) and not useful, "progress": round(p, 4), "chunk": [s, n], "lcp": lcp,
            "step_tokens": total, "innocent_tokens": int(innocent_tokens),
            "predicted_successor_ready_cut": t_cut, "predicted_successor_ready_finish": t_fin,
            "remaining_step": remaining, "per_token_cost": c, "units": units,
            "innocent_lost_work": step * p * innocent_tokens / total,
            "obsolete_remainder": remaining * (total - innocent_tokens) / total,
            **({"reason": "chunk wholly shared with the successor"} if useful else {})}


class SafePoints:
    def __init__(self, worker, mailbox, min_tokens: int, block: int, slice_min_tokens: int = 8192,
                 density: Density | None = None):
        self.wk = adapter.worker()
        self.worker, self.mb, self.min_tokens, self.block = worker, mailbox, min_tokens, block
        self.layers = self.wk.decoder_layers(worker)
        self.mlps = [self.wk.mlp_module(layer) for layer in self.layers]
        self.hooks = [self._hook(i) for i in range(len(self.layers))]
        self.mlp_hooks = [self._mlp_hook(i) for i in range(len(self.layers))]
        self.slicer = None
        self.splitter = None
        self.slice_min_tokens = int(slice_min_tokens)
        self.armed = None
        self.installed = False
        self.heap: dict | None = None   # what the install-time heap release answered (retire/heap.py)
        self.last_cost: float | None = None  # seconds per token of the last armed step (predictions at p = 0)
        self.density = density or Density()
        self.tiers = {"static": 0, "fine": 0}  # armed steps per safe-point tier

    def set_density(self, density: Density) -> None:
        """Adopt a density rule; the fine tier's MLP row count is self-checked first (retire/mlp_split.py)."""
        if self.splitter is not None:
            self.splitter.verdict_for(density.fine_for((self.slice_min_tokens, self.splitter.rows))[1])
        self.density = density

    def _tier(self) -> tuple[int, int, str]:
        static = ((self.slicer.min_tokens, self.slicer.slice_tokens) if self.slicer is not None
                  else (self.slice_min_tokens, STATIC[1]))
        return self.density.tier(static=static, last_post_ns=self.mb.last_post_ns(), now_ns=time.monotonic_ns())

    def install(self, wrapper=None) -> bool:
        """Attach to the worker's one step wrapper (retire/worker_step.py), in eager mode only."""
        if not self.wk.eager(self.worker):
            log.warning("retire: per-layer safe points need enforce_eager=True (compiled graphs fire layer hooks "
                        "unreliably); FENCE falls back to the step boundary")
            return False
        from .slicing import AttentionSlicer
        from .mlp_split import MlpSplitter
        self.slicer = AttentionSlicer(self.worker, self.layers, min_tokens=self.slice_min_tokens)
        self.splitter = MlpSplitter(self.worker, self.mlps, min_tokens=self.slice_min_tokens)
        self.set_density(self.density)
        if wrapper is None:
            from .worker_step import StepWrapper
            wrapper = StepWrapper.of(self.worker)
        wrapper.attach(safe_points=self)
        self.installed = True
        return True

    def run(self, orig, so, *args, **kwargs):
        total = self.wk.total_tokens(so)
        if total < self.min_tokens:
            return orig(so, *args, **kwargs)  # unarmed: no hook on any layer
        chunks = self.wk.chunks_of(so)
        self.armed = {"chunks": chunks, "keys": {r: mailbox_key(r) for r in chunks}, "t0": time.monotonic(),
                      "paused": 0.0, "decided": False, "total": total, "layer_t": []}
        handles = [layer.register_forward_pre_hook(h) for layer, h in zip(self.layers, self.hooks)]
        handles += [m.register_forward_pre_hook(h) for m, h in zip(self.mlps, self.mlp_hooks) if m is not None]
        lo, rows, tier = self._tier()
        self.tiers[tier] += 1
        sliced = self.slicer is not None and self.slicer.active(total, lo)
        mrows = self.splitter.usable_rows(rows) if self.splitter is not None else rows
        split = self.splitter is not None and self.splitter.active(total, lo, mrows)
        undo = self.slicer.arm(self._slice_point, rows) if sliced else []
        split_undo = self.splitter.arm(self._mlp_slice_point, mrows) if split else []
        self.armed.update(sliced=sliced, split=split, tier=tier)
        try:
            out = orig(so, *args, **kwargs)
            self.last_cost = self._elapsed(self.armed) / total
            return out
        except _Cut:
            a = self.armed
            return self.wk.cut_output(so, {"chunks": a["cut"], "decision": a["decision"]})
        finally:
            for h in handles:
                h.remove()
            if sliced:
                self.slicer.disarm(undo)
            if split:
                self.splitter.disarm(split_undo)
            self.armed = None

    # ------------------------------------------------------------------ safe points
    def _hook(self, i: int):
        def pre_hook(module, args):
            a = self.armed  # hooks are registered only while an armed step runs, so this is never None here
            a["layer_t"].append(self._elapsed(a))
            if a["decided"]:
                return None
            t = time.monotonic()
            self.mb.worker_pause_point(i, a["keys"].values())
            a["paused"] += time.monotonic() - t
            self._point(a, i, 0.0, "layer")
            return None
        return pre_hook

    def _mlp_hook(self, i: int):
        def pre_hook(module, args):
            a = self.armed
            if not a["decided"]:
                self._point(a, i, ATTENTION_SHARE, "mlp")
            return None
        return pre_hook

    def _slice_point(self, i: int, fraction: float) -> None:
        a = self.armed
        if not a["decided"]:
            self._point(a, i, ATTENTION_SHARE * fraction, f"attention slice {fraction:.3f}")

    def _mlp_slice_point(self, i: int, fraction: float) -> None:
        a = self.armed
        if not a["decided"]:
            self._point(a, i, ATTENTION_SHARE + (1 - ATTENTION_SHARE) * fraction, f"mlp slice {fraction:.3f}")

    def _point(self, a: dict, i: int, within: float, where: str) -> None:
        self.mb.bump("checks")
        revoked = self.mb.revoked() if self.mb.any_live() else {}
        if revoked:
            self._check(a, i, within, where, revoked)

    @staticmethod
    def _elapsed(a: dict) -> float:
        return time.monotonic() - a["t0"] - a["paused"]

    def _progress(self, a: dict, i: int, within: float) -> float:
        """Fraction of the step done at layer i plus `within` of it (the layer's attention is its first
        ATTENTION_SHARE, the MLP the rest: an attention slice f is at ATTENTION_SHARE * f, an MLP slice f at
        ATTENTION_SHARE + (1 - ATTENTION_SHARE) * f); measured from this step's completed layers when there are any."""
        n = len(self.layers)
        lt = a["layer_t"]
        if i >= 1 and len(lt) > i:
            per_layer = lt[i] / i
            return min(self._elapsed(a) / (per_layer * n), (i + 1) / n)
        return (i + within) / n

    def _check(self, a: dict, i: int, within: float, where: str, revoked: dict) -> None:
        ids, keys = a["chunks"], a["keys"]
        hit = [r for r in ids if keys[r] in revoked]
        if not hit:
            return
        innocents = [r for r in ids if r not in hit]
        rid = max(hit, key=lambda r: ids[r][1])  # the governing revocation: the longest revoked chunk
        lcp, new_len = revoked[keys[rid]]
        d = decide(chunk=ids[rid], lcp=lcp, new_len=new_len, block=self.block, elapsed=self._elapsed(a),
                   progress=self._progress(a, i, within), step_tokens=a["total"],
                   innocent_tokens=sum(ids[r][1] for r in innocents), per_token_cost=self.last_cost)
        a["decided"] = True
        d.update(layer=i, at=where, sliced=a["sliced"], split=a["split"], tier=a["tier"], req_ids=hit,
                 innocents=len(innocents),
                 path="safe-point" if d["cut"] else ("step-boundary:mixed" if innocents else "finish-step"))
        self._log(d)
        if d["cut"]:
            a["cut"] = {r: list(ids[r]) for r in ids}
            a["decision"] = d
            self.mb.bump("cuts")
            raise _Cut()

    def _log(self, d: dict) -> None:
        """The decision for the scheduler's FENCE, naming the revoked requests by their mailbox keys (fixed size,
        whatever the scope names), so the log never outgrows the mailbox's log area and is cut into invalid JSON."""
        rec = {k: v for k, v in d.items() if k != "req_ids"}
        rec["req_keys"] = [mailbox_key(r).hex() for r in d.get("req_ids", ())]
        self.mb.write_log(json.dumps(rec, default=float))
