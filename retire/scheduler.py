"""RetireScheduler: vLLM's Scheduler with SUPERSEDE applied atomically in the engine thread.

Invariant: this class only translates vLLM's events into calls on the transition core (retire/transition.py), which
speaks the KV port (retire/port.py, implemented for this vLLM by retire/adapter/). A SUPERSEDE rides on the
successor's ADD (`SamplingParams.extra_args["retire"]`, a msgpack `RequestTag`), so ADVANCE -> FENCE -> ALIGN -> PIN
-> RESUME -> RECLAIM run in one `add_request` call, between two engine steps; no separate ABORT exists that could
overtake it. After ADVANCE the engine commits no output of the old version (gate (a), in `update_from_output`).
Out-of-band queries, barriers and test switches (`call_utility("scheduler", cmd, payload)`) live in
`sched_commands.SchedulerCommands`.
"""
from __future__ import annotations

import time

from vllm.v1.core.sched.scheduler import Scheduler

from . import adapter
from .sched_commands import SchedulerCommands
from .transition import TransitionCore
from .types import RequestTag, decode

now = time.monotonic


class RetireScheduler(SchedulerCommands, Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from .mailbox import Mailbox
        from .participants import RankLedger

        self.retire_vllm = adapter.engine()
        port = self.retire_port = self.retire_vllm.SchedulerPort(self)
        self.retire = TransitionCore(port, mailbox=Mailbox.from_env(),
                                     ranks=RankLedger.from_env() if port.world_size > 1 else None)

    # EngineCore's utility dispatch evaluates `getattr(engine, "scheduler") and ...`: never be falsy.
    def __bool__(self) -> bool:
        return True

    def add_request(self, request) -> None:
        raw = self.retire_vllm.request_tag_bytes(request)
        if raw is None:
            return super().add_request(request)
        tag = decode(raw, RequestTag)
        if tag.supersede is None:
            self.retire.submit(request, tag)
        else:
            self.retire.supersede(request, tag)

    def finish_requests(self, request_ids, finished_status):
        finished = super().finish_requests(request_ids, finished_status)
        self.retire.on_finished([r.request_id for r in finished], now())
        return finished

    def schedule(self, *args, **kwargs):
        so = super().schedule(*args, **kwargs)
        self.retire.step += 1
        so.retire_step = self.retire.step  # pickled to every worker rank with the SchedulerOutput
        return so

    def update_from_output(self, scheduler_output, model_runner_output):
        v = self.retire_vllm
        cut = v.step_cut(model_runner_output)
        drafts = v.spec_counts(self, scheduler_output, model_runner_output) \
            if self.retire_port.spec_enabled and v.has_spec_tokens(scheduler_output) else {}
        pre = self.retire.before_commit(v.scheduled_chunks(self, scheduler_output))
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        self.retire.after_commit(pre, cut, drafts, now(), v.preempted_ids(scheduler_output))
        dropped = v.filter_outputs(outputs, self.retire.gate)
        if dropped:
            self.retire.counters["engine_frames_suppressed"] += dropped
        self.retire.after_gate()
        return outputs
