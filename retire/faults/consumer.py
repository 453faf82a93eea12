"""Consumer-side faults, attached through the facade's stream hooks.

- SlowConsumer(delay): the consumer takes `delay` seconds to process each frame (the sleep IS the fault).
- BusyConsumer(scope, after_tokens, delay=...): a SlowConsumer that, once it has taken `after_tokens` tokens of
  (scope, epoch, tenant), stays busy with them (an agent runtime running a tool on a partial answer) until the scope
  advances past `epoch`: the version's next frame waits at dequeue (barrier: `eng.wait_epoch`, no sleep). A revision
  made then always finds the engine's newer tokens queued, however fast the engine runs against `delay`: the natives
  publish them, a correct publication gate none.
- LateCompletion(scope, epoch): holds the first non-empty frame of (scope, epoch) between commit and dequeue, and
  releases it only after the scope has advanced past `epoch` (barrier: `eng.wait_epoch`, no sleep). A correct
  publication gate must suppress the released frame.
- ReleaseAtCall(scope, epoch): holds the first non-empty frame of (scope, epoch) between commit and dequeue, and
  releases it at the moment the test calls SUPERSEDE (`calling()`, just before awaiting the call), i.e. while the
  call is still running and before the facade may have advanced. A frame the consumer receives after the call is
  obsolete by definition (RETIRE.md §5): a correct facade publishes nothing of the epoch from the call on.

Every hold is released by heal as well (retire/faults/hooks.py `VersionHold`): a SUPERSEDE that never comes fails
the test's assertion, not pytest-timeout with a consumer parked in a hook.
"""
from __future__ import annotations

import asyncio

from .hooks import HookFault, VersionHold


class SlowConsumer(HookFault):
    name = "slow-consumer"
    affects = frozenset({"consume"})
    hook_point = "after_yield"

    def __init__(self, delay: float = 0.05):
        super().__init__()
        self.delay = delay
        self.frames_delayed = 0

    async def _hook(self, eng, frame) -> None:
        self.frames_delayed += 1
        await asyncio.sleep(self.delay)


class BusyConsumer(VersionHold, SlowConsumer):
    name = "busy-consumer"

    def __init__(self, scope: str, after_tokens: int, *, delay: float = 0.05, epoch: int = 0,
                 tenant: str = "default"):
        super().__init__(delay)
        self._hold_for(scope, epoch, tenant)
        self.after_tokens = after_tokens
        self.taken = 0                # tokens of the version that passed dequeue before the consumer got busy

    async def inject(self, target) -> None:
        target.seams.on_dequeue.append(self._hold)
        await super().inject(target)

    async def heal(self) -> None:
        hooks = self.target.seams.on_dequeue
        if self._hold in hooks:
            hooks.remove(self._hold)
        await super().heal()

    async def _hold(self, eng, version, out):
        if not self._matches(version):
            return out
        n = sum(len(o.token_ids) for o in out.outputs)
        if self.taken < self.after_tokens or n == 0:
            self.taken += n
            return out
        await self._park(self._advanced(eng))
        return out


class _HeldFrame(VersionHold, HookFault):
    """Holds the first non-empty frame of (scope, epoch, tenant) between commit and dequeue until `_release` fires."""

    affects = frozenset({"publish"})
    hook_point = "on_dequeue"

    def __init__(self, scope: str, epoch: int = 0, tenant: str = "default"):
        super().__init__()
        self._hold_for(scope, epoch, tenant)
        self.held = asyncio.Event()  # set once a frame is held (the test's barrier for issuing SUPERSEDE)
        self.held_tokens = 0

    def _release(self, eng):  # pragma: no cover - overridden
        raise NotImplementedError

    async def _hook(self, eng, version, out):
        if not self._matches(version) or not out.outputs or not out.outputs[0].token_ids:
            return out
        self.held_tokens = len(out.outputs[0].token_ids)
        self.held.set()
        await self._park(self._release(eng))
        return out


class LateCompletion(_HeldFrame):
    name = "late-completion"

    def _release(self, eng):
        return self._advanced(eng)


class ReleaseAtCall(_HeldFrame):
    name = "release-at-call"

    def __init__(self, scope: str, epoch: int = 0, tenant: str = "default"):
        super().__init__(scope, epoch, tenant)
        self._go = asyncio.Event()

    def calling(self) -> None:
        """The test is about to await SUPERSEDE: release the held frame (it reaches the gate during the call)."""
        self._go.set()

    def _release(self, eng):
        return self._go.wait()
