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

The trial driver, the judge, the warm-ups, the prompts and the engine shapes are the shared, packaged ones in
`retire.trials` (perf and conformance use the same). `retire demo --help` lists the options (`--sections`,
`--repeats`, `--out`); `make run` runs everything.
"""
from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

from .trials import Judge, Trial, oracle_warmup, revision_trial, warm_prefill, warmup

POLICY_ORDER = ("native-cold", "native-prefix", "retire")
REPEATS = 3
now = time.monotonic


_T0 = now()


def log(msg: str) -> None:
    print(f"[{now() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


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
    from oracles.runs import OracleEngine

    from .engine import RetireEngine
    from .trials.shapes import shape_kwargs

    path, shape = shape_kwargs(key)
    t0 = now()
    base = RetireEngine(path, "retire", **shape)
    oracle = OracleEngine(path, **shape)
    await warmup(base)
    await oracle_warmup(oracle)
    facades = {p: base.with_policy(p) for p in POLICY_ORDER}
    log(f"[{key}] subject + oracle engines up in {now() - t0:.1f}s ({shape})")
    return base, facades, oracle, shape


async def close_engines(base, facades, oracle) -> None:
    for f in facades.values():
        await f.close()
    await base.close()
    oracle.shutdown()


async def run_section(sid: str, title: str, key: str, make_case, trial_kwargs: dict, sp_old, sp_new,
                      repeats: int = REPEATS) -> dict:
    base, facades, oracle, shape = await open_engines(key)
    judge = Judge(oracle, base.backend.block_size)
    trials: list[Trial] = []
    try:
        # untimed: one full prefill unit and a decode step, so first-shape costs stay out of the figures
        await warm_prefill(base, base.backend.chunk)
        for r in range(repeats):
            prompt, revised = make_case(r)
            order = POLICY_ORDER[r % 3:] + POLICY_ORDER[:r % 3]  # interleaved, rotating which policy goes first
            for p in order:
                eng = facades[p]
                async with _slow(eng):
                    t = await revision_trial(eng, f"{sid}-{r}", prompt, revised, sp_old, sp_new, **trial_kwargs)
                t.ok, t.verdict = await judge.check(p, revised, sp_new, t.new, t.reused)
                trials.append(t)
                log(f"[{sid} {r + 1}/{repeats}] {p:13s} obsolete={t.obsolete:3d} ttft={_f(t.ttft)}s "
                    f"reused={t.reused:5d} fence={_f(t.fence)}s ({t.fence_path}) wall={t.wall:.2f}s frontier@call={t.frontier_at_call}"
                    f" -> {t.verdict}")
        for f in facades.values():
            await f.audit()
    finally:
        await close_engines(base, facades, oracle)
    return {"id": sid, "scenario": title, "model": key, "shape": shape, "summary": summarize(trials),
            "trials": [t.row() for t in trials]}


def _slow(eng):
    from .faults import SlowConsumer

    return SlowConsumer(0.05).on(eng)


def sections_spec(sp_old, sp_new) -> dict:
    """Section id -> (title, engine shape, case builder(repeat) -> (prompt, revised), revision moment)."""
    from .trials.prompts import repo_prompt, revise
    from .trials.shapes import SHAPES

    chunk = SHAPES["long"]["max_num_batched_tokens"]
    n_long, n_unit = 8192, 1024

    def long_case(repeat):
        # one prompt pair for the repeats (each trial starts from an empty prefix cache): its two 8K oracle runs are
        # computed once, which keeps the demo inside its time budget on a 2-core machine
        p = repo_prompt(n_long, 0)
        return p, revise(p, int(0.9 * n_long), n_long, 0)

    def unit_case(seed):
        p = repo_prompt(n_unit, 100 + seed)
        return p, revise(p, int(0.9 * n_unit), n_unit, 100 + seed)

    return {
        "mid-prefill": (f"A: revision mid-prefill (long, {n_long}-token repo prompt, 90% shared, SUPERSEDE at "
                        f"frontier >= {chunk})", "long", long_case, {"frontier": chunk}),
        "during-decode": (f"B: revision during decode (unit, {n_unit}-token repo prompt, 90% shared, SUPERSEDE after "
                          f"the consumer got 3 tokens and the engine produced 4 more)", "unit", unit_case,
                          {"after_tokens": 3, "lag": 4}),
    }


async def run(sections: Sequence[str] = ("mid-prefill", "during-decode"), repeats: int = REPEATS,
              out: str | Path | None = None) -> dict:
    """Run the chosen sections, print their tables, write the JSON document (default results/demo.json)."""
    from vllm import SamplingParams

    t0 = now()
    sp_new = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=5)
    sp_old = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    spec = sections_spec(sp_old, sp_new)
    done = []
    for sid in sections:
        title, key, make_case, moment = spec[sid]
        done.append(await run_section(sid, title, key, make_case, moment, sp_old, sp_new, repeats))
    total = now() - t0

    print()
    for s in done:
        print(table(s["scenario"], s["summary"]))
        print()
    print(f"obsolete tokens: sum over the {repeats} repeats (per repeat), counted by the consumer's clock against the "
          "SUPERSEDE call; TTFT, reused, wall: medians; wall = SUPERSEDE call -> successor's last token dequeued.")
    print(f"total demo wall time: {total:.1f}s")
    sys.stdout.flush()
    doc = _document(done, repeats, total)
    path = Path(out) if out else Path(__file__).resolve().parent.parent / "results" / "demo.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str))
    print(f"wrote {path}")
    return doc


def _document(sections: list[dict], repeats: int, total: float) -> dict:
    import torch
    import vllm

    doc = {"demo": "coding-agent revision", "repeats": repeats, "policies": list(POLICY_ORDER),
           "slow_consumer_s_per_frame": 0.05, "successor": {"max_tokens": 16, "greedy": True, "logprobs": 5},
           "sections": sections, "total_wall_s": total,
           "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "python": platform.python_version()},
           "machine": {"nproc": os.cpu_count(), "platform": platform.platform(), "machine": platform.machine(),
                       "mem_total_gb": _mem_gb()}}
    doc["failed"] = sum(1 for s in sections for t in s["trials"] if not t["ok"])
    doc["retire_obsolete"] = sum(r["obsolete_tokens_published"] for s in sections for r in s["summary"]
                                 if r["policy"] == "retire")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    """`retire demo [--sections A,B] [--repeats N] [--out PATH]` (also `python -m retire.demo`). Exit status 1 when a
    successor failed its oracle or retire published an obsolete token."""
    import argparse

    ap = argparse.ArgumentParser(prog="retire demo", description="the side-by-side revision demo "
                                 "(native-cold | native-prefix | retire) on the local tiny models")
    ap.add_argument("--sections", default="mid-prefill,during-decode",
                    help="comma-separated: mid-prefill (long model, ~3 min), during-decode (unit model, ~1 min)")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="trials per policy and section")
    ap.add_argument("--out", default=None, help="JSON document path (default results/demo.json)")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    _quiet_environment()
    chosen = [s for s in args.sections.split(",") if s]
    known = ("mid-prefill", "during-decode")
    bad = [s for s in chosen if s not in known]
    if bad or not chosen or args.repeats < 1:
        ap.error(f"sections must be among {known} and repeats >= 1 (got {chosen}, {args.repeats})")
    result = asyncio.run(run(chosen, args.repeats, args.out))
    if result["failed"] or result["retire_obsolete"]:
        print(f"DEMO CHECK FAILED: {result['failed']} successor(s) failed their oracle, "
              f"retire published {result['retire_obsolete']} obsolete tokens", file=sys.stderr)
        return 1
    return 0


def _quiet_environment() -> None:
    """vLLM's WARNING level still prints ~20 lines per engine (eager mode, Triton, tcmalloc...): the demo shows errors
    only unless RETIRE_DEMO_VERBOSE=1. Set before the engines start (their child processes inherit it)."""
    if os.environ.get("RETIRE_DEMO_VERBOSE") != "1":
        os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"
        os.environ.setdefault("PYTHONWARNINGS", "ignore")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _mem_gb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        return round(kb / 2 ** 20, 1)
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    sys.exit(main())
