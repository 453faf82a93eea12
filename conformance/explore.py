"""`make explore`: the engine-free exploration machine (conformance/fixtures/explorer.py) at scale.

Runs `--schedules` Hypothesis schedules (examples) split over `--workers` processes (one per core), each an
independent random exploration; prints progress to stderr and, on its last line, the schedules run, the supersedes
(inherited / cold / refused), the faults injected, the violations (must be 0) and the wall time. Exit status 1 if
any worker found a violation (its shrunk schedule is printed).

    python -m conformance.explore --schedules 10000 --workers 2
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import traceback
from collections import Counter


def _worker(args) -> tuple[dict, str | None]:
    idx, n, steps = args
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    from conformance.fixtures.explorer import CoreMachine

    t0 = time.monotonic()
    done = [0]
    orig_init = CoreMachine.__init__

    def init(self):
        orig_init(self)
        done[0] += 1
        if done[0] % 500 == 0:
            print(f"[explore w{idx}] {done[0]}/{n} schedules, {time.monotonic() - t0:.0f} s", file=sys.stderr,
                  flush=True)

    CoreMachine.__init__ = init
    s = settings(max_examples=n, stateful_step_count=steps, deadline=None, database=None,
                 suppress_health_check=list(HealthCheck), print_blob=True)
    err = None
    try:
        run_state_machine_as_test(CoreMachine, settings=s)
    except BaseException:  # noqa: BLE001 - reported to the parent with the shrunk schedule
        err = traceback.format_exc(limit=30)
    return dict(CoreMachine.counts), err


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.explore")
    ap.add_argument("--schedules", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--steps", type=int, default=25, help="rules per schedule (Hypothesis stateful_step_count)")
    ap.add_argument("--json", default=None, help="also write the counts, violations and wall time to this file")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    per = [a.schedules // a.workers + (i < a.schedules % a.workers) for i in range(a.workers)]
    with mp.get_context("fork").Pool(a.workers) as pool:
        results = pool.map(_worker, [(i, n, a.steps) for i, n in enumerate(per)])
    total: Counter = Counter()
    errors = [e for _, e in results if e]
    for c, _ in results:
        total.update(c)
    for e in errors:
        print(e, file=sys.stderr)
    wall = time.monotonic() - t0
    if a.json:
        import json
        import platform
        with open(a.json, "w") as f:
            json.dump({"counts": dict(total), "violations": len(errors), "errors": errors, "wall_s": round(wall, 1),
                       "schedules_requested": a.schedules, "workers": a.workers, "steps": a.steps,
                       "cpus": os.cpu_count(), "python": platform.python_version(),
                       "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, f, indent=1)
    print(f"explore: {total['schedules']} schedules, {total['supersedes']} supersedes ({total['inherited']} inherited, "
          f"{total['cold']} cold, {total['refused']} refused), {total['faults'] + total['pressure']} faults injected, "
          f"{total['cuts']} in-step cuts, {total['dram_steps']} DRAM steps, {len(errors)} violations, {wall:.1f} s")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
