"""The suite's own plumbing, engine-free: the device parameter never turns a broken CPU build into a skip, a hang
fails its test with a stack, and the `retire demo` console entry point parses its arguments (it raised TypeError
before: the console dispatcher passed argv to a coroutine function that took none).

Negative controls: a probe that raises makes the CPU guarantee FAIL (not skip); a test that hangs is reported
failed by pytest-timeout, with the stack of the hanging frame, both when the main thread hangs and when it waits on
the suite's loop thread (the way every engine test waits)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import device_verdict

ROOT = Path(__file__).resolve().parent.parent


def _raise():
    raise ImportError("libtorch_cpu.so: cannot open shared object file")


@pytest.mark.parametrize("want,probe,cuda,verdict", [
    ("cpu", lambda: "cpu", False, "run"),
    ("cpu", _raise, False, "fail"),             # negative control: the old probe turned this into a skip
    ("cpu", lambda: "unknown", False, "fail"),
    ("cpu", lambda: "cuda", True, "skip"),      # a CUDA build on a GPU runner: the gpu parametrization runs instead
    ("cuda", lambda: "cpu", False, "skip"),
    ("cuda", lambda: "cuda", True, "run"),
    ("cuda", _raise, True, "fail"),
    ("cuda", lambda: "cpu", True, "skip"),
], ids=["cpu-ok", "cpu-probe-raises", "cpu-unknown", "cpu-on-cuda-build", "cuda-absent", "cuda-ok",
        "cuda-probe-raises", "cuda-device-cpu-build"])
def test_device_verdict(want, probe, cuda, verdict):
    got, reason = device_verdict(want, probe, cuda_available=cuda)
    assert got == verdict, (got, reason)
    if verdict == "fail" and probe is _raise:
        assert "libtorch_cpu.so" in reason  # the failure names the cause


HANGING = textwrap.dedent('''
    import asyncio, threading

    def test_main_thread_hangs():
        asyncio.run(asyncio.Event().wait())

    def test_waits_on_a_loop_thread_that_never_answers():
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
        never = asyncio.run_coroutine_threadsafe(asyncio.Event().wait(), loop)
        never.result()  # the way LoopRunner.run waits for an engine call
''')


def test_a_hang_fails_with_a_stack(tmp_path):
    (tmp_path / "test_hang.py").write_text(HANGING)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=3",
                        "-o", "timeout_method=signal", str(tmp_path / "test_hang.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "2 failed" in out, out
    assert out.count("Timeout") >= 2, out
    assert "test_main_thread_hangs" in out and "never.result()" in out, "the stack of the hanging frame is shown"


def test_retire_demo_entry_point_parses_its_arguments(capsys):
    from retire.cli import main

    with pytest.raises(SystemExit, match="^0$"):
        main(["demo", "--help"])
    assert "--sections" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="^2$"):
        main(["demo", "--sections", "nope"])
    assert "sections must be among" in capsys.readouterr().err
