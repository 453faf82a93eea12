"""The coding-agent revision demo (`make run` = `python -m retire.demo`, also `retire demo`).

Three policies ("native-cold", "native-prefix", "retire") run side by side, sibling facades of one subject engine,
interleaved per repeat, in four sections (`retire.demo.sections` states each one's setup):

  1. a revision inside a long prefill step whose work is obsolete (retire cuts it at a safe point);
  2. a churned prefix (other traffic between the revision and the successor's admission; retire's pinned handoff);
  3. a revision during decode with a slow consumer (natives publish the queued obsolete tokens);
  4. the tie: the running step is shared with the revision, so retire lets it finish.

Every successor is judged against a stock oracle engine (`retire.trials.Judge`). The demo prints one table per
section (medians over the repeats), then a one-screen summary (`retire.demo.summary.headline_table`): per section the
median paired successor-TTFT ratios, obsolete tokens published and tokens reused, retire's FENCE paths and the oracle
verdict count. It writes results/demo.json and exits 1 when a successor failed its oracle or retire published an
obsolete token. `retire demo --help` lists `--sections`, `--repeats`, `--out`.
"""
from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
from pathlib import Path
from typing import Sequence

from .engines import POLICY_ORDER, Engines, now
from .sections import RUN_ORDER, SECTIONS, SLOW_S
from .summary import headline, headline_table, summarize, table

async def run(sections: Sequence[str] = RUN_ORDER, repeats: int | None = None, out: str | Path | None = None) -> dict:
    """Run the chosen sections (grouped by subject engine), print their tables and the summary, write the JSON
    document (default results/demo.json). `repeats` None: each section's default (2 for sections 1 and 4, 1 for
    the churn section 2, whose trials each run 1.1x the KV capacity of other traffic, 3 for the cheap decode section 3;
    this keeps `make run` under 5 minutes on this 2-core machine)."""
    t0 = now()
    engines = Engines()
    done = []
    try:
        for sid in [s for s in RUN_ORDER if s in sections]:
            sec = SECTIONS[sid]
            n = repeats or sec.repeats
            rows = await sec.run(engines, n)
            done.append({"id": sid, "number": sec.number, "scenario": sec.title, "model": sec.shape, "repeats": n,
                         "summary": summarize(rows), "trials": rows})
    finally:
        await engines.close()
    total = now() - t0
    done.sort(key=lambda s: s["number"])
    heads = [headline(s) for s in done]
    print()
    for s in done:
        print(table(s["scenario"], s["summary"]))
        print()
    print("Summary (medians over each section's repeats; ratios: median of per-repeat paired ratios; section 2 TTFT "
          "is admission -> first token, after the churn):")
    print(headline_table(heads))
    print(f"total demo wall time: {total:.1f}s (engine starts and warm-ups {engines.started_s:.1f}s)")
    sys.stdout.flush()
    doc = _document(done, heads, repeats, total)
    path = Path(out) if out else Path(__file__).resolve().parents[2] / "results" / "demo.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str))
    print(f"wrote {path}")
    return doc


def _document(sections: list[dict], heads: list[dict], repeats: int, total: float) -> dict:
    import torch
    import vllm

    doc = {"demo": "coding-agent revision", "repeats": repeats or "per section", "policies": list(POLICY_ORDER),
           "slow_consumer_s_per_frame": SLOW_S, "successor": {"max_tokens": 8, "greedy": True, "logprobs": 5},
           "sections": sections, "headline": heads, "total_wall_s": total,
           "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "python": platform.python_version()},
           "machine": {"nproc": os.cpu_count(), "platform": platform.platform(), "machine": platform.machine(),
                       "mem_total_gb": _mem_gb()}}
    doc["failed"] = sum(1 for s in sections for t in s["trials"] if not t["ok"])
    doc["retire_obsolete"] = sum(r["obsolete_tokens_published"] or 0 for s in sections for r in s["summary"]
                                 if r["policy"] == "retire")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    """`retire demo [--sections in-step,churn,...] [--repeats N] [--out PATH]` (also `python -m retire.demo`). Exit
    status 1 when a successor failed its oracle or retire published an obsolete token."""
    import argparse

    ap = argparse.ArgumentParser(prog="retire demo", description="the side-by-side revision demo "
                                 "(native-cold | native-prefix | retire) on the local tiny models, four sections")
    ap.add_argument("--sections", default=",".join(RUN_ORDER),
                    help=f"comma-separated, among {', '.join(RUN_ORDER)} (default: all four)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="trials per policy in every chosen section (default: 2 in sections 1 and 4, 1 in section 2, "
                    "3 in section 3)")
    ap.add_argument("--out", default=None, help="JSON document path (default results/demo.json)")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    _quiet_environment()
    chosen = [s for s in args.sections.split(",") if s]
    known = RUN_ORDER
    bad = [s for s in chosen if s not in known]
    if bad or not chosen or (args.repeats is not None and args.repeats < 1):
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

