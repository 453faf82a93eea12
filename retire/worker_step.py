"""The one wrapper around the model runner's step (worker process), and the participants that run inside it.

Invariant: each worker has at most one wrapper around `execute_model`, installed when the first participant is
attached (`attach`; a worker with no participant, e.g. compiled mode with one rank, keeps vLLM's own call), so no two
wrappers' order can matter. Inside it, in this fixed order: the rank receipt participant forgets finished requests;
the step runs (through the safe points when they are active, which may cut it); the rank receipt participant
acknowledges the step, counting a cut chunk only up to its start.
"""
from __future__ import annotations

from . import adapter


class StepWrapper:
    def __init__(self, worker):
        self.worker = worker
        self.safe_points = None   # retire.safepoints.SafePoints
        self.receipts = None      # retire.participants.RankRecorder
        self.installed = False

    @classmethod
    def of(cls, worker) -> "StepWrapper":
        w = getattr(worker, "_retire_step", None)
        if w is None:
            w = worker._retire_step = cls(worker)
        return w

    def attach(self, *, safe_points=None, receipts=None) -> None:
        if safe_points is not None:
            self.safe_points = safe_points
        if receipts is not None:
            self.receipts = receipts
        if not self.installed:
            adapter.worker().wrap_step(self.worker, self.step)
            self.installed = True

    def step(self, orig, scheduler_output, *args, **kwargs):
        rec, sp = self.receipts, self.safe_points
        if rec is not None:
            rec.before(scheduler_output)
        if sp is not None:
            out = sp.run(orig, scheduler_output, *args, **kwargs)
        else:
            out = orig(scheduler_output, *args, **kwargs)
        if rec is not None:
            rec.after(scheduler_output, out)
        return out
