"""Churn(fraction_of_capacity): unique-prefix traffic between a revision and its successor's admission.

`inject(eng)` reads the engine's KV capacity (blocks x block size, null block excluded, from the scheduler's `ping`),
then runs distinct random prompts (fresh seeds, `max_tokens=1`, a few at a time) through a sibling "native-prefix"
facade until their prompt tokens total `fraction_of_capacity` x capacity, and returns when all of them finished.
Each prompt allocates fresh blocks; the allocator takes them from the head of vLLM's free queue, so once the volume
exceeds what is free ahead of them, blocks that are only held by the prefix cache (ref 0) are evicted in LRU order.
Blocks with a live reference (a held successor's table, a handoff pin) cannot be evicted.

Heal ends every churn request it started (closing the sibling facade aborts any still running). What churn evicted
from the prefix cache is the effect under measurement and is not restored.
"""
from __future__ import annotations

import asyncio
import itertools

from .base import Fault

_tags = itertools.count()


class Churn(Fault):
    name = "churn"
    affects = frozenset({"kv.capacity"})

    def __init__(self, fraction_of_capacity: float, *, seed: int = 0, request_tokens: int = 512,
                 concurrency: int = 2):
        super().__init__()
        if fraction_of_capacity < 0:
            raise ValueError("fraction_of_capacity must be >= 0")
        self.fraction = float(fraction_of_capacity)
        self.seed, self.request_tokens, self.concurrency = int(seed), int(request_tokens), max(1, int(concurrency))
        self.capacity_tokens = 0
        self.target_tokens = 0
        self.churned_tokens = 0
        self.requests = 0
        self._facade = None

    async def inject(self, target) -> None:
        from vllm import SamplingParams

        from oracles.runs import collect

        from ..trials.prompts import tokens

        await super().inject(target)
        ping = await target.backend.sched("ping")
        self.capacity_tokens = (int(ping["num_blocks"]) - 1) * int(ping["block_size"])
        self.target_tokens = int(round(self.fraction * self.capacity_tokens))
        per = max(1, min(self.request_tokens, target.backend.max_model_len - 2))
        sizes, left = [], self.target_tokens
        while left > 0:
            sizes.append(min(per, left))
            left -= sizes[-1]
        fac = self._facade = target.with_policy("native-prefix")
        tag = next(_tags)
        sp = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
        sem = asyncio.Semaphore(self.concurrency)

        async def one(i: int, n: int) -> None:
            async with sem:
                scope = f"__churn{tag}_{i}__"
                await fac.submit(scope, tokens(n, 1_000_003 * (self.seed + 1) + 7919 * tag + i), sp)
                await collect(fac, scope)
                self.churned_tokens += n
                self.requests += 1

        await asyncio.gather(*(one(i, n) for i, n in enumerate(sizes)))

    async def heal(self) -> None:
        if self._facade is not None and not self._facade.closed:
            await self._facade.close()
        await super().heal()


# ------------------------------------------------------------------------------------------------ scenario driver
ARMS = ("native", "retire_hbm", "retire_dram")  # the churn figure's arm names (retire/report)


class ChurnTrial:
    """What one arm did under churn. `retained` = prefix tokens the successor reused (retire: inherited tokens of the
    certificate; native: vLLM's num_cached_tokens); `certified` = what ALIGN certifies for this pair of prompts;
    `recovery` = successor admission -> its first token (HBM: release of the held successor; DRAM: start of the
    restore; native: the successor's submission); `interval` = revision -> the successor's last token (churn
    included)."""

    def __init__(self, **kw):
        self.ok, self.verdict = None, ""
        self.__dict__.update(kw)

    def row(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("new", "transition")}


async def churn_trial(eng, arm: str, scope: str, prompt, revised, sp_old, sp_new, fraction: float, *, seed: int = 0,
                      request_tokens: int = 512, concurrency: int = 2) -> ChurnTrial:
    """One revision with `Churn(fraction)` between the revision and the successor's admission, on facade `eng`
    ("native-prefix" facade for arm "native", "retire" otherwise). The prefix cache is reset first, so no arm reuses
    another arm's blocks. The revision lands once the predecessor produced its first token (its prompt KV written).

    - native: the revision is vLLM's abort of the old request; churn runs; then the successor is submitted and finds
      whatever the prefix cache still holds.
    - retire_hbm: SUPERSEDE admits the successor held with the certified blocks in its table (pinned); churn runs;
      the successor is released. The certified pages' digests are compared before and after churn.
    - retire_dram: SUPERSEDE under Contract(dram_tier=True) copies the certified pages out and returns their blocks;
      churn runs; release restores them into fresh blocks (digest-checked)."""
    import time

    from oracles.runs import collect

    from ..align import common_prefix_len
    from ..barriers import wait_engine
    from ..trials.warm import reset_prefix_cache

    if arm not in ARMS:
        raise ValueError(f"unknown churn arm {arm!r}; choose one of {ARMS}")
    now = time.monotonic
    reset = await reset_prefix_cache(eng)
    await eng.submit(scope, prompt, sp_old)
    old_task = asyncio.ensure_future(collect(eng, scope, 0))
    await wait_engine(eng, scope, out_tokens=1, epoch=0)
    bs = eng.backend.block_size
    certified = min(common_prefix_len(prompt, revised), len(revised) - 1) // bs * bs
    churn = Churn(fraction, seed=seed, request_tokens=request_tokens, concurrency=concurrency)
    marks: dict = {}

    def on_frame(f):
        if f.token_ids and "first" not in marks:
            marks["first"] = now()

    t_rev = now()
    if arm == "native":
        tr, new, t_adm, info = await _native_revision(eng, scope, revised, sp_new, churn, old_task, on_frame)
    else:
        tr, new, t_adm, info = await _retire_revision(eng, scope, revised, sp_new, churn, old_task, on_frame,
                                                      dram=arm == "retire_dram")
    t_end = now()
    retained = int(tr.inherited_tokens or 0)
    return ChurnTrial(arm=arm, fraction=fraction, scope=scope, certified=certified, retained=retained,
                      retained_frac=(retained / certified) if certified else None,
                      recovery=(marks["first"] - t_adm) if "first" in marks else None, interval=t_end - t_rev,
                      churned_tokens=churn.churned_tokens, capacity_tokens=churn.capacity_tokens,
                      cold_reason=tr.cold_reason, cache_reset=reset, new=new, transition=tr, **info)


async def _native_revision(eng, scope, revised, sp_new, churn: Churn, old_task, on_frame):
    """The revision as vLLM offers it: abort the old request, churn, then submit the successor (no pin: it finds
    whatever the prefix cache still holds)."""
    import time

    from oracles.runs import collect

    await eng.backend.abort(eng.internal_id(scope))
    await old_task
    t0 = time.monotonic()
    async with churn.on(eng):
        pass
    info = {"churn_s": time.monotonic() - t0}
    t_adm = time.monotonic()
    tr = await eng.supersede(scope, 0, revised, sp_new)
    new = await collect(eng, scope, 1, on_frame=on_frame)
    return tr, new, t_adm, info


async def _retire_revision(eng, scope, revised, sp_new, churn: Churn, old_task, on_frame, *, dram: bool):
    """SUPERSEDE with the successor held (certified pages pinned in HBM, or copied to the DRAM tier), churn, then
    release; the pinned pages' digests are compared before and after the churn."""
    import time

    from oracles.runs import collect

    from ..dram import HoldRestore
    from ..types import Contract

    info: dict = {}
    async with HoldRestore(eng, scope) as hold:
        tr = await eng.supersede(scope, 0, revised, sp_new, contract=Contract(dram_tier=dram, digests=True))
        await old_task
        info["free_blocks_while_held"] = (await eng.backend.sched("stats"))["free_blocks"]
        t0 = time.monotonic()
        async with churn.on(eng):
            pass
        info["churn_s"] = time.monotonic() - t0
        cert = tr.certificate
        if cert is not None and not dram:
            ids = [b for g in cert.block_ids for b in g]
            after = (await eng.backend.worker("retire_block_digests", ids))[0]
            info["pages_intact_after_churn"] = after == list(cert.digests)
        new_task = asyncio.ensure_future(collect(eng, scope, 1, on_frame=on_frame))
        t_adm = time.monotonic()
        await hold.release()
    new = await new_task
    info["certified_by_engine"] = cert.tokens if cert is not None else 0
    if dram:
        info["dram_state"] = tr.extra.get("dram", {}).get("state")
    return tr, new, t_adm, info
