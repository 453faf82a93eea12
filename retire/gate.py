"""`retire conform --vllm SPEC`: gate one vLLM build. Seam report, side environment, the suite run there, verdicts.

Invariant: every step that can fail (reading the sources, building the environment, the suite itself, a hang past
its bound) turns into `unknown` verdicts with the reason, never into a crash of the gate or a pass; the static seam
report of the SPEC's own sources is applied last, so a guarantee whose seam is missing, moved or changed is unknown
naming the seam whatever its cases did. The suite runs in a child process (its own session, killed as a group at the
bound) with this checkout first on PYTHONPATH, so the retire under test is the one that runs the gate.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .conform import apply_seams, crashed, verdicts
from .sideenv import ROOT, Target, build_overlay, ensure, package_dir, resolve, venvs_root


def _static_report(spec: str) -> tuple[dict, dict]:
    from .seamcheck import check
    from .vllmtree import open_tree

    try:
        tree = open_tree(spec)
        return check(tree).to_dict(), tree.describe()
    except Exception as e:  # noqa: BLE001  (reported; the verdicts fall back to what the suite says)
        return {"error": f"{type(e).__name__}: {e}", "affected": {}}, {}


def _log_path(spec: str) -> Path:
    d = venvs_root() / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"conform-{re.sub(r'[^A-Za-z0-9._=-]+', '_', spec)[-60:]}-{time.strftime('%Y%m%d-%H%M%S')}.log"


def _wrapper() -> list[str]:
    """RETIRE_ENGINE_WRAPPER: a command the suite runs under (e.g. a machine's engine-slot lock)."""
    return shlex.split(os.environ.get("RETIRE_ENGINE_WRAPPER", ""))


def _suite(t: Target, marker: str, pytest_args: list[str], timeout: float, log, overlay: Path | None):
    """Run `python -m retire.cli conform` in the target environment; returns (inner result | None, exit code, note)."""
    env = dict(os.environ)
    path = [str(overlay)] if overlay else []
    path += [str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(path)
    with tempfile.TemporaryDirectory(prefix="retire-conform-") as tmp:
        raw = Path(tmp) / "raw.json"
        cmd = [*_wrapper(), t.python, "-m", "retire.cli", "conform", "--json", str(raw), "-m", marker]
        if pytest_args:
            cmd += ["--", *pytest_args]
        log.write(f"[gate] {' '.join(cmd)}\n[gate] PYTHONPATH={env['PYTHONPATH']}\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
            note = None
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            note = f"the suite did not finish within {timeout:.0f} s (killed)"
        inner = json.loads(raw.read_text()) if raw.exists() else None
    return inner, rc, note


def run_spec(spec: str, *, marker: str, pins: tuple[str, ...] = (), pytest_args: list[str] = (),
             timeout: float = 5400.0, json_out: str | None = None) -> dict:
    t0 = time.monotonic()
    seams, vllm = _static_report(spec)
    result = {"kind": "retire-conformance", "version": 2, "spec": spec, "vllm": vllm, "seams": seams,
              "environment": {}, "wall_s": {}, "pytest_exit": None, "verdicts": verdicts({})}
    log_path = _log_path(spec)
    result["log"] = str(log_path)

    def done(why: str | None = None) -> dict:
        if why:
            crashed(result, why)
        apply_seams(result, seams)
        result["wall_s"]["total"] = round(time.monotonic() - t0, 1)
        return result

    try:
        t = resolve(spec, tuple(pins))
    except (ValueError, FileNotFoundError) as e:
        return done(f"cannot resolve --vllm {spec!r}: {e}")
    result["environment"] = {"venv": str(t.venv) if t.venv else "the calling environment",
                             "requirement": t.requirement, "pins": list(t.pins),
                             "overlay_of": str(t.overlay_of) if t.overlay_of else None,
                             "runner": " ".join(_wrapper()) or None}
    if t.unrunnable:
        return done(f"not run: {t.unrunnable}")
    with open(log_path, "a") as log:
        tb = time.monotonic()
        try:
            ensure(t, log)
        except Exception as e:  # noqa: BLE001
            return done(f"environment: {e} (log {log_path})")
        result["wall_s"]["environment"] = round(time.monotonic() - tb, 1)
        with tempfile.TemporaryDirectory(prefix="retire-overlay-") as tmp:
            overlay = None
            if t.overlay_of:
                overlay = build_overlay(t.overlay_of, package_dir(t.python), Path(tmp))
            ts = time.monotonic()
            inner, rc, note = _suite(t, marker, list(pytest_args), timeout, log, overlay)
            result["wall_s"]["suite"] = round(time.monotonic() - ts, 1)
    result["pytest_exit"] = inner.get("pytest_exit") if inner else rc
    if inner is None:
        return done(note or f"the suite wrote no verdicts (exit {rc}; log {log_path})")
    result["verdicts"], result["machine"] = inner["verdicts"], inner.get("machine", {})
    result["seams_runtime"] = inner.get("seams")
    result["vllm"]["runtime_version"] = result["machine"].get("vllm")
    return done(note)
