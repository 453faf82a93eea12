"""`retire conform --json OUT`: run the conformance suite and write one verdict per guarantee and path.

Invariant: a verdict is `true` only if at least one case of that guarantee ran and none failed; `false` if any case
failed or errored; `null` (unknown) if nothing ran (all skipped or deselected). A crash of the run itself is unknown
for every guarantee, never a pass. This JSON is the artefact a vLLM CI job gates on.
"""
from __future__ import annotations

import json
import os
import platform
import sys
from collections import defaultdict
from pathlib import Path

GUARANTEES = {
    "test_publication": "current-version publication",
    "test_handoff": "versioned handoff",
    "test_page_fault": "handoff: page-fault positive control",
    "test_dram": "path: DRAM tier (offload, restore, late transfer, digest mismatch)",
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
    "test_tensor_parallel": "path: tensor parallel 2 (every-rank receipts)",
    "test_exact": "numerical mode: exact (bit-identical) and ordinary",
    "test_quota_pressure": "pin quota under pressure (zero quota goes cold)",
    "test_cotenant": "co-tenant load: retired-state isolation under supersede bursts",
    "test_compiled_fallback": "compiled mode falls back to the step boundary",
    "test_replay_driver": "trace replay driver",
    "test_gate_a": "current-version publication: engine gate (a) on its own",
    "test_epochs": "epochs: concurrent SUPERSEDEs (exactly one wins), stale epochs change nothing",
    "test_truncation": "versioned handoff: truncation revisions (len(new) - 1 cap)",
    "test_names": "identities: adversarial tenant/scope names never alias",
    "test_layering": "packaging: the product never imports the testbed; the control plane never imports oracles",
    "test_plumbing": "suite plumbing: device verdict, hangs fail with a stack, demo entry point",
    "test_demo": "retire demo through the console entry point",
}


class _Collector:
    def __init__(self):
        self.cases = defaultdict(lambda: {"passed": 0, "failed": 0, "skipped": 0, "failures": []})

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


def verdicts(cases: dict) -> dict:
    out = {}
    for mod, name in GUARANTEES.items():
        c = cases.get(mod, {"passed": 0, "failed": 0, "skipped": 0, "failures": []})
        valid = False if c["failed"] else (True if c["passed"] else None)
        out[name] = {"valid": valid, "module": f"conformance/{mod}.py", **c}
    return out


def machine_info() -> dict:
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()}
    for mod in ("vllm", "torch", "transformers"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            info[mod] = None
    return info


def main(argv: list[str]) -> int:
    import argparse

    import pytest

    ap = argparse.ArgumentParser(prog="retire conform")
    ap.add_argument("--json", required=True, help="where to write the verdicts")
    ap.add_argument("-m", default="not slow and not bench", help="pytest marker expression")
    ap.add_argument("pytest_args", nargs="*")
    a = ap.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    col = _Collector()
    rc = pytest.main([str(root / "conformance"), "-q", "-m", a.m, "-p", "no:cacheprovider", *a.pytest_args],
                     plugins=[col])
    result = {"kind": "retire-conformance", "version": 1, "pytest_exit": int(rc), "machine": machine_info(),
              "verdicts": verdicts(col.cases)}
    if int(rc) not in (0, 1, 5):  # interrupted / internal error / usage error: unknown, never a pass
        for v in result["verdicts"].values():
            v["valid"] = None if v["valid"] is not False else False
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=2))
    bad = [k for k, v in result["verdicts"].items() if v["valid"] is False]
    print(f"[retire conform] {len(result['verdicts'])} guarantees: "
          f"{sum(v['valid'] is True for v in result['verdicts'].values())} valid, {len(bad)} invalid, "
          f"{sum(v['valid'] is None for v in result['verdicts'].values())} unknown -> {a.json}")
    return 1 if bad else 0
