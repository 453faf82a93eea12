"""The coding-agent revision demo (`make run` = `python -m retire.demo`).

Three policies ("native-cold", "native-prefix", "retire") run side by side on ONE engine configuration (sibling facades
on one vLLM engine), interleaved, 3 repeats each, with a slow consumer (50 ms per frame) on the facade:

  A. revision mid-prefill (`long` model, Qwen3 512x8, prefill unit 2048): a repository-like prompt of 8192 tokens;
     SUPERSEDE is issued once the engine reports a writer frontier >= 2048 (one prefill step computed), with a revised
     prompt sharing 90% of its tokens.
  B. revision during decode (`unit` model): the consumer has received a few tokens of the old answer and the engine
     has produced ~4 more (queued for the slow consumer) when SUPERSEDE lands; this is where obsolete tokens escape.

The revision moment is chosen on the engine's own view (`sched("request_state")`, answered between two engine steps),
never by sleeping. Every successor (16 greedy tokens, logprobs=5) is checked against a clean oracle on a stock vLLM
engine with the same execution shape: exact against its mode-matched reference (`clean_run` when nothing was reused,
`clean_prefix_run(revised[:reused], revised)` otherwise), else the logprob-closeness rule against `clean_run`.
Native-cold must be exact.

Section A repeats one prompt pair 3 times (its two 8K oracle runs are then computed once); section B uses a fresh
pair per repeat. Every trial starts from an empty prefix cache, so no arm reuses another arm's blocks.

The printed table and results/demo.json report medians over the repeats. "wall" is SUPERSEDE call -> successor's last
token dequeued (the slow consumer's 50 ms/frame applies to the successor's frames too, equally for every policy).

The trial drivers here (`revision_trial`, `Judge`) are reused by the benchmarks in perf/.
"""
from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# vLLM's WARNING level still prints ~20 lines per engine (eager mode, Triton, tcmalloc...): the demo shows errors only
# unless RETIRE_DEMO_VERBOSE=1. Child processes inherit the environment.
if os.environ.get("RETIRE_DEMO_VERBOSE") != "1":
    os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

POLICY_ORDER = ("native-cold", "native-prefix", "retire")
REPEATS = 3
now = time.monotonic


_T0 = now()


def log(msg: str) -> None:
    print(f"[{now() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- trial driver
@dataclass
class Trial:
    policy: str
    scope: str
    obsolete: int                 # tokens of epoch 0 yielded to the consumer after supersede() was called
    ttft: float | None            # Transition.successor_ttft: supersede call -> first non-empty successor frame
    reused: int                   # Transition.inherited_tokens (native-prefix: vLLM's num_cached_tokens)
    fence: float | None           # Transition.fence_latency: ADVANCE -> last old writer closed
    wall: float                   # supersede call -> successor's last frame dequeued
    frontier_at_call: int         # engine frontier of the old version seen by the barrier's last poll
    old: Any = None               # oracles.Run of what the old consumer received
    new: Any = None               # oracles.Run of the successor
    transition: Any = None
    verdict: str = ""
    ok: bool | None = None

    @property
    def fence_path(self) -> str:
        """How the old writer was closed: "step-boundary" / "safe-point" (retire receipts) or "native-abort"."""
        rs = getattr(self.transition, "receipts", ()) or ()
        return rs[0].path if rs else "native-abort"

    def row(self) -> dict:
        tr = self.transition
        return {"policy": self.policy, "scope": self.scope, "obsolete_tokens_published": self.obsolete,
                "successor_ttft_s": self.ttft, "tokens_reused": self.reused, "fence_latency_s": self.fence, "fence_path": self.fence_path,
                "wall_s": self.wall, "frontier_at_call": self.frontier_at_call,
                "cold_reason": getattr(tr, "cold_reason", None), "verdict": self.verdict, "ok": self.ok,
                "successor_tokens": list(self.new.tokens) if self.new is not None else None}


async def reset_prefix_cache(eng) -> bool:
    """Start every trial from an empty prefix cache, so one arm never reuses another arm's blocks."""
    return bool(await eng.backend.reset_prefix_cache())


async def revision_trial(eng, scope: str, prompt: list[int], revised: list[int], sp_old, sp_new, *,
                         frontier: int | None = None, after_tokens: int = 0, lag: int = 0, contract=None,
                         reset_cache: bool = True) -> Trial:
    """Submit `prompt`, consume it, SUPERSEDE with `revised` at the chosen engine-visible moment, follow the successor
    at once (concurrently with the old consumer draining), and return what happened.

    Revision moment: `frontier` given -> once the engine's writer frontier of the old version is >= frontier
    (mid-prefill); otherwise once the consumer received `after_tokens` tokens and the engine generated `lag` more."""
    from oracles.runs import collect
    from retire.barriers import wait_engine
    from retire.types import Contract

    if reset_cache and not await reset_prefix_cache(eng):
        log(f"  warning: prefix cache reset refused before {scope} (blocks still in use)")
    await eng.submit(scope, prompt, sp_old)
    got = {"n": 0}
    reached = asyncio.Event()

    def on_frame(f):
        got["n"] += len(f.token_ids)
        if got["n"] >= after_tokens:
            reached.set()

    old_task = asyncio.ensure_future(collect(eng, scope, 0, on_frame=on_frame))
    if frontier is not None:
        st = await wait_engine(eng, scope, frontier=frontier, epoch=0)
    else:
        if after_tokens > 0:
            waiter = asyncio.ensure_future(reached.wait())
            await asyncio.wait([old_task, waiter], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        st = await wait_engine(eng, scope, out_tokens=got["n"] + lag, epoch=0)
    seen = int(st["frontier"]) if st else -1  # -1: the old version had already left the scheduler
    before = eng.stats()["obsolete_tokens_published"]
    t_call = now()
    tr = await eng.supersede(scope, 0, revised, sp_new, contract=contract or Contract())
    new_task = asyncio.ensure_future(collect(eng, scope, 1))
    new = await new_task
    wall = now() - t_call
    old = await old_task
    obsolete = eng.stats()["obsolete_tokens_published"] - before
    reused = int(tr.inherited_tokens or 0)
    return Trial(eng.policy, scope, obsolete, tr.successor_ttft, reused, tr.fence_latency, wall, seen, old, new, tr)


# ---------------------------------------------------------------------------------------------- oracle verdicts
class Judge:
    """Checks a successor against clean oracle runs (cached per revised prompt and reused length).

    Rules: exact against the mode-matched reference (`clean_run` if nothing was reused, else
    `clean_prefix_run(revised[:reused], revised)` provided the oracle also reused exactly that much); native-cold must
    pass that; the other policies may instead pass the logprob-closeness rule against `clean_run` ("tolerant")."""

    def __init__(self, oracle, block_size: int = 32, *, same_shape: bool = True):
        """`same_shape=False` when the subject runs a prefill unit the oracle engine cannot reproduce (a unit set at
        run time with `set_step_tokens` above the oracle's chunk): the exact rule then does not apply to anyone, and
        native-cold is judged by the closeness rule like the other policies."""
        self.oracle = oracle
        self.block = block_size
        self.same_shape = same_shape
        self._clean: dict = {}
        self._prefix: dict = {}

    async def clean(self, revised, sp):
        k = (tuple(revised), repr(sp))
        if k not in self._clean:
            self._clean[k] = await self.oracle.clean_run(revised, sp)
        return self._clean[k]

    async def prefix(self, revised, n: int, sp):
        k = (tuple(revised), n, repr(sp))
        if k not in self._prefix:
            self._prefix[k] = await self.oracle.clean_prefix_run(revised[:n], revised, sp)
        return self._prefix[k]

    async def check(self, policy: str, revised, sp, new, reused: int) -> tuple[bool, str]:
        from oracles import compare_logprobs_close, compare_tokens

        if len(new.tokens) != sp.max_tokens:
            return False, f"FAIL: successor produced {len(new.tokens)} of {sp.max_tokens} tokens"
        exact_detail = ""
        if reused == 0:
            v = compare_tokens(subject=new, oracle=await self.clean(revised, sp), subject_name=policy,
                               oracle_name="clean_run")
            if v:
                return True, "exact vs clean_run"
            exact_detail = v.detail
        elif reused % self.block == 0 and reused < len(revised):
            ref = await self.prefix(revised, reused, sp)
            if ref.inherited_tokens == reused:
                v = compare_tokens(subject=new, oracle=ref, subject_name=policy, oracle_name="clean_prefix_run")
                if v:
                    return True, f"exact vs clean_prefix_run[:{reused}]"
                exact_detail = v.detail
            else:
                exact_detail = f"oracle reused {ref.inherited_tokens}, not {reused}"
        if policy == "native-cold" and self.same_shape:
            return False, f"FAIL exact: {exact_detail}"
        v = compare_logprobs_close(subject=new, oracle=await self.clean(revised, sp), subject_name=policy,
                                   oracle_name="clean_run")
        if v:
            return True, "tolerant vs clean_run"
        return False, f"FAIL: {v.detail} (exact: {exact_detail})"


# ---------------------------------------------------------------------------------------------- summaries
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(trials: list[Trial]) -> list[dict]:
    out = []
    for p in POLICY_ORDER:
        ts = [t for t in trials if t.policy == p]
        if not ts:
            continue
        kinds = sorted({t.verdict.split(" vs ")[0] if t.ok else "FAIL" for t in ts})
        out.append({
            "policy": p, "trials": len(ts),
            "obsolete_tokens_published": sum(t.obsolete for t in ts),
            "obsolete_per_trial": [t.obsolete for t in ts],
            "successor_ttft_s_median": med([t.ttft for t in ts]),
            "tokens_reused_median": med([t.reused for t in ts]),
            "fence_latency_s_median": med([t.fence for t in ts]),
            "wall_s_median": med([t.wall for t in ts]),
            "oracle_pass": sum(1 for t in ts if t.ok), "oracle_rules": kinds,
            "verdict": f"{sum(1 for t in ts if t.ok)}/{len(ts)} pass ({', '.join(kinds)})",
        })
    return out


def table(title: str, rows: list[dict]) -> str:
    head = ("policy", "obsolete tokens published", "successor TTFT (median, s)", "tokens reused", "wall time (s)",
            "oracle verdict")
    body = []
    for r in rows:
        obs = f"{r['obsolete_tokens_published']} ({'+'.join(map(str, r['obsolete_per_trial']))})"
        body.append((r["policy"], obs, _f(r["successor_ttft_s_median"]), _i(r["tokens_reused_median"]),
                     _f(r["wall_s_median"], 2), r["verdict"]))
    w = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(cells)) + " |"
    sep = "|" + "|".join("-" * (x + 2) for x in w) + "|"
    return "\n".join([title, line(head), sep, *(line(b) for b in body)])


def _f(x, nd=3):
    return "-" if x is None else f"{x:.{nd}f}"


def _i(x):
    return "-" if x is None else str(int(x))


# ---------------------------------------------------------------------------------------------- scenarios
async def open_engines(key: str):
    from conformance.fixtures.engines import shape_kwargs, warmup
    from oracles.runs import OracleEngine
    from retire.engine import RetireEngine

    path, shape = shape_kwargs(key)
    t0 = now()
    base = RetireEngine(path, "retire", **shape)
    oracle = OracleEngine(path, **shape)
    await warmup(base)
    await _oracle_warmup(oracle)
    facades = {p: base.with_policy(p) for p in POLICY_ORDER}
    log(f"[{key}] subject + oracle engines up in {now() - t0:.1f}s ({shape})")
    return base, facades, oracle, shape


async def _oracle_warmup(oracle) -> None:
    from vllm import SamplingParams

    await oracle.clean_run(list(range(3, 43)), SamplingParams(max_tokens=4, temperature=0, ignore_eos=True,
                                                              logprobs=2))


async def close_engines(base, facades, oracle) -> None:
    for f in facades.values():
        await f.close()
    await base.close()
    oracle.shutdown()


async def run_section(sid: str, title: str, key: str, make_case, trial_kwargs: dict, sp_old, sp_new) -> dict:
    base, facades, oracle, shape = await open_engines(key)
    judge = Judge(oracle, base.backend.block_size)
    trials: list[Trial] = []
    try:
        # untimed: one full prefill unit and a decode step, so first-shape costs stay out of the figures
        await warm_prefill(base, base.backend.chunk)
        for r in range(REPEATS):
            prompt, revised = make_case(r)
            order = POLICY_ORDER[r % 3:] + POLICY_ORDER[:r % 3]  # interleaved, rotating which policy goes first
            for p in order:
                eng = facades[p]
                async with _slow(eng):
                    t = await revision_trial(eng, f"{sid}-{r}", prompt, revised, sp_old, sp_new, **trial_kwargs)
                t.ok, t.verdict = await judge.check(p, revised, sp_new, t.new, t.reused)
                trials.append(t)
                log(f"[{sid} {r + 1}/{REPEATS}] {p:13s} obsolete={t.obsolete:3d} ttft={_f(t.ttft)}s "
                    f"reused={t.reused:5d} fence={_f(t.fence)}s ({t.fence_path}) wall={t.wall:.2f}s frontier@call={t.frontier_at_call}"
                    f" -> {t.verdict}")
        for f in facades.values():
            await f.audit()
    finally:
        await close_engines(base, facades, oracle)
    return {"id": sid, "scenario": title, "model": key, "shape": shape, "summary": summarize(trials),
            "trials": [t.row() for t in trials]}


async def warm_prefill(eng, chunk: int) -> None:
    from vllm import SamplingParams

    from conformance.fixtures.prompts import repo_prompt
    from oracles.runs import collect

    scope = f"__warm_prefill_{chunk}__"
    await eng.submit(scope, repo_prompt(chunk + 64, 4242), SamplingParams(max_tokens=2, temperature=0,
                                                                          ignore_eos=True))
    await collect(eng, scope)


def _slow(eng):
    from retire.faults import SlowConsumer

    return SlowConsumer(0.05).on(eng)


async def main() -> dict:
    from vllm import SamplingParams

    from conformance.fixtures.engines import SHAPES
    from conformance.fixtures.prompts import repo_prompt, revise

    t0 = now()
    sp_new = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=5)
    sp_old = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)

    chunk = SHAPES["long"]["max_num_batched_tokens"]
    n_long = 8192

    def long_case(repeat):
        # one prompt pair for the 3 repeats (each trial starts from an empty prefix cache): its two 8K oracle runs
        # are computed once, which keeps the demo inside its time budget on a 2-core machine
        p = repo_prompt(n_long, 0)
        return p, revise(p, int(0.9 * n_long), n_long, 0)

    n_unit = 1024

    def unit_case(seed):
        p = repo_prompt(n_unit, 100 + seed)
        return p, revise(p, int(0.9 * n_unit), n_unit, 100 + seed)

    sections = []
    sections.append(await run_section(
        "mid-prefill", f"A: revision mid-prefill (long, {n_long}-token repo prompt, 90% shared, SUPERSEDE at frontier >= {chunk})",
        "long", long_case, {"frontier": chunk}, sp_old, sp_new))
    sections.append(await run_section(
        "during-decode", f"B: revision during decode (unit, {n_unit}-token repo prompt, 90% shared, SUPERSEDE after the consumer got "
        f"3 tokens and the engine produced 4 more)",
        "unit", unit_case, {"after_tokens": 3, "lag": 4}, sp_old, sp_new))
    total = now() - t0

    print()
    for s in sections:
        print(table(s["scenario"], s["summary"]))
        print()
    print("obsolete tokens: sum over the 3 repeats (per repeat); TTFT, reused, wall: medians; wall = SUPERSEDE call ->"
          " successor's last token dequeued.")
    print(f"total demo wall time: {total:.1f}s")
    sys.stdout.flush()

    import torch
    import vllm

    doc = {"demo": "coding-agent revision", "repeats": REPEATS, "policies": list(POLICY_ORDER),
           "slow_consumer_s_per_frame": 0.05, "successor": {"max_tokens": 16, "greedy": True, "logprobs": 5},
           "sections": sections, "total_wall_s": total,
           "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "python": platform.python_version()},
           "machine": {"nproc": os.cpu_count(), "platform": platform.platform(), "machine": platform.machine(),
                       "mem_total_gb": _mem_gb()}}
    doc["failed"] = sum(1 for s in sections for t in s["trials"] if not t["ok"])
    doc["retire_obsolete"] = sum(r["obsolete_tokens_published"] for s in sections for r in s["summary"]
                                 if r["policy"] == "retire")
    out = Path(__file__).resolve().parent.parent / "results" / "demo.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(doc, indent=2, default=str))
    print(f"wrote {out}")
    return doc


def _mem_gb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        return round(kb / 2 ** 20, 1)
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    result = asyncio.run(main())
    if result["failed"] or result["retire_obsolete"]:
        print(f"DEMO CHECK FAILED: {result['failed']} successor(s) failed their oracle, "
              f"retire published {result['retire_obsolete']} obsolete tokens", file=sys.stderr)
        sys.exit(1)
