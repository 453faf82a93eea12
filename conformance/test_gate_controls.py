"""The gate's behaviour control (real engines, `make gate-controls`; marker `slow`, not in the default suite).

A patched copy of the installed vLLM in which `BlockPool.touch` stops taking a reference on blocks that carry a
prefix-cache hash keeps every seam (the static check is green, `test_gate.py`), yet a certified block that retire pins
at FENCE and aliases at RESUME is no longer held. `retire conform --vllm TREE` on that copy must turn the handoff
guarantee `false` with its failing cases named: a gate that stays green here is broken. The verdict JSON is kept
(`RETIRE_GATE_CONTROL_JSON`, default results/gate-control-touch.json) as the recorded result.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conformance.fixtures import vllm_patch as vp
from retire.gate import run_spec

pytestmark = pytest.mark.slow


@pytest.mark.timeout(2400)
def test_touch_that_skips_hashed_blocks_turns_the_handoff_false(tmp_path):
    tree = vp.patched_copy(tmp_path / "tree", vp.TOUCH_SKIPS_HASHED)
    # -x: after the first broken case the shared engine's block accounting is corrupt and later cases wait on it
    # (each until pytest-timeout); the first failure is the verdict.
    res = run_spec(str(tree), marker="not slow and not bench",
                   pytest_args=["conformance/test_handoff.py", "-x", "-o", "timeout=300"], timeout=1800)
    out = Path(os.environ.get("RETIRE_GATE_CONTROL_JSON", "results/gate-control-touch.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    assert res["seams"]["ok"], res["seams"]["affected"]  # every seam present: only behaviour changed
    v = res["verdicts"]["versioned handoff"]
    assert v["verdict"] == "false" and v["failures"], v
