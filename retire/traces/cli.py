"""Command line: ``python -m retire.traces {synth,extract,window} ...``.

* ``synth --seed 0 --window 120 --out PATH`` writes the densest window of
  ``synthesize(seed)`` in the replay format (``--full`` writes the whole month instead).
* ``extract LOGDIR_OR_FILES... --out CSV`` writes ``scope,time`` (ISO-8601 UTC) and prints
  the extraction report as JSON.
* ``window PATH --seconds 120`` prints the densest window's statistics as JSON; ``PATH`` is
  an ``extract`` CSV or a replay ``.jsonl``.
* ``plan PATH --time-scale 10 --lead 2`` prints the replay schedule the driver
  (:mod:`.driver`, perf/test_bench_replay.py) would issue for ``PATH``: versions, final
  versions, wall span after compression, transitions per scope.

Every command prints one JSON object on stdout and returns 0 on success.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

from .extract import extract_transitions, transitions_frame
from .replay import read_trace_jsonl, write_trace_jsonl
from .synth import synthesize, write_synth_window
from .window import DEFAULT_BURST_GAP, densest_window, times_ns


def read_transitions(path: str | Path) -> pd.DataFrame:
    """Load a transition frame from a replay ``.jsonl`` or an ``extract`` CSV."""
    p = Path(path)
    if p.suffix == ".jsonl":
        return read_trace_jsonl(p)
    raw = pd.read_csv(p, dtype={"scope": str})
    t = pd.to_datetime(raw["time"], utc=True, format="ISO8601").dt.as_unit("ns")
    return transitions_frame(raw["scope"].tolist(), t.astype("int64").to_numpy())


def write_transitions_csv(df: pd.DataFrame, path: str | Path) -> None:
    """Write ``scope,time`` with ISO-8601 UTC times (nanosecond-exact)."""
    ns = times_ns(df)
    iso = [pd.Timestamp(int(v), unit="ns", tz="UTC").isoformat() for v in ns]
    pd.DataFrame({"scope": df["scope"].astype(str), "time": iso}).to_csv(path, index=False)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m retire.traces", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("synth", help="synthetic trace fit to the paper's statistics")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--window", type=float, default=120.0, help="window length, seconds")
    s.add_argument("--out", required=True)
    s.add_argument("--full", action="store_true", help="write the whole trace, not the window")
    e = sub.add_parser("extract", help="transitions from agent session logs")
    e.add_argument("paths", nargs="+", help="log files and/or folders (recursive *.jsonl)")
    e.add_argument("--out", required=True, help="CSV path")
    e.add_argument("--max-gap", type=float, default=3600.0, help="seconds (default 3600)")
    w = sub.add_parser("window", help="densest window statistics")
    w.add_argument("path", help="extract CSV or replay .jsonl")
    w.add_argument("--seconds", type=float, default=120.0)
    w.add_argument("--burst-gap", type=float, default=DEFAULT_BURST_GAP)
    p = sub.add_parser("plan", help="replay schedule of a trace (retire.traces.driver)")
    p.add_argument("path", help="extract CSV or replay .jsonl")
    p.add_argument("--time-scale", type=float, default=10.0, help="trace seconds per wall second")
    p.add_argument("--lead", type=float, default=2.0, help="trace seconds from task start to first transition")
    return ap


def replay_plan_summary(path: str | Path, time_scale: float, lead: float) -> dict:
    """The driver's schedule for a trace file, summarized (no engine needed)."""
    from .driver import Workload, plan, trace_arrivals

    arrivals = trace_arrivals(read_transitions(path))
    ps = plan(arrivals, Workload(time_scale=time_scale, lead_s=lead))
    per_scope: dict[str, int] = {}
    for _, s in arrivals:
        per_scope[s] = per_scope.get(s, 0) + 1
    return {"path": str(path), "time_scale": time_scale, "lead_s": lead, "transitions": len(arrivals),
            "versions": len(ps), "final_versions": sum(p.final for p in ps),
            "wall_span_s": round(max((p.t for p in ps), default=0.0), 6), "transitions_per_scope": per_scope}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    args = _parser().parse_args(argv)
    if args.cmd == "synth":
        if args.full:
            df = synthesize(args.seed)
            write_trace_jsonl(df, args.out, source=f"retire.traces.synthesize(seed={args.seed})")
            out = {"out": args.out, "n": len(df), "scopes": int(df["scope"].nunique())}
        else:
            out = {"out": args.out, **write_synth_window(args.out, args.seed, args.window).summary()}
    elif args.cmd == "extract":
        df, report = extract_transitions(args.paths, max_gap=args.max_gap)
        write_transitions_csv(df, args.out)
        out = {"out": args.out, **report.summary()}
    elif args.cmd == "plan":
        out = replay_plan_summary(args.path, args.time_scale, args.lead)
    else:
        out = densest_window(read_transitions(args.path), args.seconds, args.burst_gap).summary()
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
