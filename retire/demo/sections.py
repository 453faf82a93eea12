"""The demo's four sections: where retire's mechanisms matter, and the tie.

Every section runs the three policies ("native-cold", "native-prefix", "retire") as sibling facades of one subject
engine, interleaved per repeat (the policy that goes first rotates), each trial from an empty prefix cache, and judges
every successor against a stock oracle engine (`retire.trials.Judge`: exact against the mode-matched reference, else
the logprob-closeness rule). The revision moment is always engine-visible (a writer-frontier or output-token barrier
answered by EngineCore between two steps), never a sleep.

1. in-step     (long-8k, prefill unit 4096): SUPERSEDE once the first prefill step is written; the revised prompt
               diverges before the second step, so that running step's work is obsolete. Retire cuts it at a
               safe point (a decoder layer); the natives' abort waits for the step's end.
2. churn       (long-churn, 320 KV blocks): other traffic (`Churn(1.1)` x KV capacity) runs between the revision and
               the successor's admission. Retire's held successor keeps the certified blocks pinned; native-prefix
               finds them evicted. TTFT here is admission -> first token (the churn itself is in `wall`).
3. decode      (long-churn): the revision lands during decode, with a slow consumer (50 ms per frame) that has
               received 3 tokens and is busy with them (`BusyConsumer`: its next frame waits at dequeue until the
               scope advances) while the engine produced 4 more; natives publish the queued obsolete tokens. The
               busy consumer makes the queue certain however fast the engine runs against the 50 ms; a consumer
               only slow per frame keeps pace with an engine slower than it and leaves nothing queued.
4. tie         (long-8k, prefill unit 2048): SUPERSEDE once the first step is written, but the revised prompt shares
               the whole running step, so retire lets it finish and inherits what native-prefix finds in its cache.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .engines import POLICY_ORDER, Engines, log

IN_STEP_UNIT, IN_STEP_PROMPT, IN_STEP_LCP = 4096, 2 * 4096 + 256, 2048
TIE_UNIT, TIE_PROMPT, TIE_LCP = 2048, 2 * 2048 + 256, 2 * 2048 + 128
CHURN_PROMPT, CHURN_LCP, CHURN_REVISED, CHURN_LEVEL = 4200, 4100, 4160, 1.1
DECODE_PROMPT = 1024
SLOW_S, BUSY_AFTER = 0.05, 3


@dataclass(frozen=True)
class Section:
    id: str
    number: int
    title: str
    shape: str
    run: Callable
    repeats: int  # default repeats (paired rounds; sized so `make run` stays under 5 minutes on 2 cores);
    # `--repeats` overrides every section's


def _sps():
    from vllm import SamplingParams

    greedy = dict(temperature=0, ignore_eos=True)
    return (SamplingParams(max_tokens=2, **greedy), SamplingParams(max_tokens=64, **greedy),
            SamplingParams(max_tokens=8, logprobs=5, **greedy))


def _order(r: int) -> tuple:
    return POLICY_ORDER[r % 3:] + POLICY_ORDER[:r % 3]


def _row(t, r: int) -> dict:
    return {"repeat": r, **t.row()}


def _log(sid: str, r: int, repeats: int, row: dict) -> None:
    ttft, fence = row["successor_ttft_s"], row["fence_latency_s"]
    log(f"[{sid} {r + 1}/{repeats}] {row['policy']:13s} obsolete={row['obsolete_tokens_published']} "
        f"ttft={'-' if ttft is None else f'{ttft:.3f}'}s reused={row['tokens_reused']} "
        f"fence={'-' if fence is None else f'{fence:.3f}'}s ({row['fence_path']}) wall={row['wall_s']:.2f}s "
        f"-> {row['verdict']}")


async def _prefill_section(engines: Engines, sid: str, shape: str, unit: int, n: int, lcp: int, repeats: int):
    """Sections 1 and 4: SUPERSEDE once the old version's writer frontier reached `unit` (its first prefill step is
    written, the second is running); the revised prompt shares `lcp` tokens and adds 256."""
    from ..trials import Judge, repo_prompt, revise, revision_trial

    sp_old, _, sp_new = _sps()
    subj = await engines.open(shape)
    judge = Judge(await engines.oracle(shape), subj.block, same_shape=unit <= 2048)  # oracle "long": unit 2048
    prompt = repo_prompt(n, 4000 + unit)
    revised = revise(prompt, lcp, lcp + 256, 4001 + unit)
    rows = []
    await subj.set_unit(unit)
    try:
        for r in range(repeats):
            for p in _order(r):
                eng = subj.facades[p]
                t = await revision_trial(eng, f"{sid}-{r}", prompt, revised, sp_old, sp_new, frontier=unit)
                t.ok, t.verdict = await judge.check(p, revised, sp_new, t.new, t.reused)
                rows.append(_row(t, r))
                rows[-1]["cut"] = _cut(t)
                _log(sid, r, repeats, rows[-1])
    finally:
        await subj.set_unit(None)
    return rows


def _cut(t) -> dict | None:
    """Where retire's FENCE closed the old writer (its receipt's decision), for the record."""
    rs = getattr(t.transition, "receipts", ()) or ()
    if not rs:
        return None
    d = dict(getattr(rs[0], "detail", {}) or {})
    return {"path": rs[0].path, **{k: d.get(k) for k in ("cut", "layer") if k in d}}


async def in_step(engines: Engines, repeats: int):
    return await _prefill_section(engines, "in-step", "long-8k", IN_STEP_UNIT, IN_STEP_PROMPT, IN_STEP_LCP, repeats)


async def tie(engines: Engines, repeats: int):
    return await _prefill_section(engines, "tie", "long-8k", TIE_UNIT, TIE_PROMPT, TIE_LCP, repeats)


async def churn(engines: Engines, repeats: int):
    """Section 2 through the packaged churn driver: arm "native" (abort, churn, resubmit) on the two native facades,
    arm "retire_hbm" (held successor, certified blocks pinned through the churn) on retire."""
    from ..faults.churn import churn_trial
    from ..trials import Judge, repo_prompt, revise

    from vllm import SamplingParams

    _, _, sp_new = _sps()
    sp_old = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    subj = await engines.open("long-churn")
    judge = Judge(await engines.oracle("long-churn"), subj.block)
    prompt = repo_prompt(CHURN_PROMPT, 4200)
    revised = revise(prompt, CHURN_LCP, CHURN_REVISED, 4201)
    rows = []
    for r in range(repeats):
        for p in _order(r):
            arm = "retire_hbm" if p == "retire" else "native"
            t = await churn_trial(subj.facades[p], arm, f"churn-{r}-{p}", prompt, revised, sp_old, sp_new,
                                  CHURN_LEVEL, seed=10 * r + POLICY_ORDER.index(p), request_tokens=2048)
            t.ok, t.verdict = await judge.check(p, revised, sp_new, t.new, t.retained)
            rows.append({"repeat": r, "policy": p, "scope": t.scope, "obsolete_tokens_published": None,
                         "successor_ttft_s": t.recovery, "tokens_reused": t.retained,
                         "fence_latency_s": t.transition.fence_latency, "wall_s": t.interval,
                         "fence_path": _path(t.transition),
                         "certified": t.certified, "churned_tokens": t.churned_tokens,
                         "capacity_tokens": t.capacity_tokens, "churn_s": t.churn_s,
                         "pages_intact_after_churn": getattr(t, "pages_intact_after_churn", None),
                         "cold_reason": t.cold_reason, "verdict": t.verdict, "ok": t.ok,
                         "successor_tokens": list(t.new.tokens)})
            _log("churn", r, repeats, rows[-1])
    return rows


def _path(tr) -> str:
    rs = getattr(tr, "receipts", ()) or ()
    return rs[0].path if rs else "native-abort"


async def decode(engines: Engines, repeats: int):
    """Section 3 through the shared driver, with `BusyConsumer(scope, 3, delay=0.05)` on every facade."""
    from ..faults import BusyConsumer
    from ..trials import Judge, repo_prompt, revise, revision_trial

    _, sp_old, sp_new = _sps()
    subj = await engines.open("long-churn")
    judge = Judge(await engines.oracle("long-churn"), subj.block)
    rows = []
    for r in range(repeats):
        prompt = repo_prompt(DECODE_PROMPT, 100 + r)
        revised = revise(prompt, int(0.9 * DECODE_PROMPT), DECODE_PROMPT, 100 + r)
        for p in _order(r):
            eng = subj.facades[p]
            async with BusyConsumer(f"decode-{r}", BUSY_AFTER, delay=SLOW_S).on(eng):
                t = await revision_trial(eng, f"decode-{r}", prompt, revised, sp_old, sp_new,
                                         after_tokens=BUSY_AFTER, lag=4)
            t.ok, t.verdict = await judge.check(p, revised, sp_new, t.new, t.reused)
            rows.append(_row(t, r))
            _log("decode", r, repeats, rows[-1])
    return rows


SECTIONS = {s.id: s for s in (
    Section("in-step", 1, f"1: revision inside a long prefill step whose work is obsolete (long, prefill unit "
            f"{IN_STEP_UNIT}, {IN_STEP_PROMPT}-token repo prompt, revised prompt shares {IN_STEP_LCP}; SUPERSEDE "
            f"at frontier >= {IN_STEP_UNIT})", "long-8k", in_step, 2),
    Section("churn", 2, f"2: churned prefix (long, 320 KV blocks, {CHURN_PROMPT}-token prompt, revised shares "
            f"{CHURN_LCP}; {CHURN_LEVEL}x KV capacity of other traffic between revision and admission; TTFT from "
            f"admission)", "long-churn", churn, 1),
    Section("during-decode", 3, f"3: revision during decode (long, {DECODE_PROMPT}-token repo prompt, 90% shared, "
            f"slow consumer {int(SLOW_S * 1000)} ms/frame, busy after its first {BUSY_AFTER} tokens: SUPERSEDE once "
            f"the engine produced 4 more)", "long-churn", decode, 3),
    Section("tie", 4, f"4: the tie: the running step is shared with the revision (long, prefill unit {TIE_UNIT}, "
            f"{TIE_PROMPT}-token prompt, revised shares {TIE_LCP}; SUPERSEDE at frontier >= {TIE_UNIT})", "long-8k",
            tie, 2),
)}
# run order: sections that share a subject engine run back to back
RUN_ORDER = ("in-step", "tie", "churn", "during-decode")
