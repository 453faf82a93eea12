"""Closing an engine releases vLLM's AsyncLLM while the interpreter is whole (retire/backend.py, the adapter's
`released`).

Oracle: a separate Python process, the way a user's program runs: its stderr at exit and a weak reference to the
AsyncLLM. vLLM's AsyncLLM sits in a reference cycle; collected only at interpreter exit, its `__del__` shuts down
again with the module globals gone and prints "Exception ignored in: <function AsyncLLM.__del__ ...> TypeError".
Negative control: a stock AsyncLLM shut down the plain way (no release) prints exactly that, so the check can fail.
"""
from __future__ import annotations

import subprocess

import pytest

from conformance.fixtures.engines import EXIT_NOISE as NOISE
from conformance.fixtures.programs import run_program

SUBJECT = '''
import asyncio, gc, weakref

async def main():
    {early_import}
    from oracles.runs import collect
    from retire import RetireEngine
    from retire.trials.shapes import shape_env, shape_kwargs
    path, kw = shape_kwargs("unit")
    with shape_env("unit"):
        eng = RetireEngine(path, "retire", **kw)
    from vllm import SamplingParams
    await eng.submit("s", list(range(5, 60)), SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    run = await collect(eng, "s")
    ref = weakref.ref(eng.engine_client)
    await eng.close()
    print("tokens", len(run.tokens), "collected", ref() is None, flush=True)
    try:
        eng.engine_client
    except Exception as e:
        print("after close:", type(e).__name__, flush=True)

if __name__ == "__main__":
    asyncio.run(main())
'''

PLAIN_STOCK = '''
import asyncio

async def main():
    from vllm import SamplingParams
    from oracles.runs import OracleEngine
    from retire.trials.shapes import shape_env, shape_kwargs
    path, kw = shape_kwargs("unit")
    with shape_env("unit"):
        o = OracleEngine(path, **kw)
    await o.clean_run(list(range(5, 60)), SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    o.llm.shutdown()  # vLLM's own shutdown, no release
    print("stopped", flush=True)

if __name__ == "__main__":
    asyncio.run(main())
'''


def _run(tmp_path, code: str) -> subprocess.CompletedProcess:
    return run_program(tmp_path, code, timeout=240)


# vLLM keeps the traceback of an import error from the first import of vllm.multimodal.media.audio (torchcodec is
# absent: `_torchcodec_import_exc`); its frames link back to every frame that was running then, locals included. So
# the engine must be collectable whichever frame imports vLLM first: the user's program ("user") or the engine start
# itself ("engine start").
@pytest.mark.timeout(300)
@pytest.mark.parametrize("first_import", ["user", "engine start"])
def test_closing_the_last_facade_collects_the_engine_and_exit_is_quiet(tmp_path, first_import):
    early = "from vllm import SamplingParams" if first_import == "user" else "pass"
    p = _run(tmp_path, SUBJECT.replace("{early_import}", early))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "tokens 3 collected True" in p.stdout, p.stdout
    assert "after close: EngineClosed" in p.stdout, p.stdout
    assert NOISE not in p.stderr, p.stderr[-3000:]


@pytest.mark.timeout(300)
def test_negative_control_a_plain_shutdown_prints_the_exit_traceback(tmp_path):
    p = _run(tmp_path, PLAIN_STOCK)
    assert p.returncode == 0 and "stopped" in p.stdout, p.stderr[-3000:]
    assert NOISE in p.stderr, "the checker could not see vLLM's exit traceback"
