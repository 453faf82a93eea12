"""Compiled mode falls back to the step boundary (issue #4: per-layer hooks fire unreliably in compiled graphs).

Invariant: `SafePoints.install()` installs nothing (no layer hook, no wrapped `execute_model`) unless the worker runs
eager (compilation mode NONE), and says so once in the log; `RetireWorkerExtension.retire_install_safe_points` then
reports `active: False` with the reason, and the facade never posts to the mailbox, so FENCE uses the step boundary.

The first two tests drive the real `SafePoints` against a stand-in worker (a two-layer torch module tree with vLLM's
own `CompilationMode` values); the eager case is the negative control (the wrapper IS installed, and an armed step
runs with one hook per layer, an unarmed one with none). The last test (`slow`: compiling the model on CPU takes
minutes) starts a real engine with `enforce_eager=False` and checks the fallback end to end: safe points inactive, a
revision mid-prefill is fenced at the step boundary, the successor matches its oracle and the audit is clean.
"""
from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest
import torch

from retire.mailbox import Mailbox, create_path
from retire.safepoints import SafePoints


def _worker(mode):
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])
    seen: list[list[int]] = []  # hooks per layer while each step ran

    def execute_model(scheduler_output, *a, **k):
        seen.append([len(layer._forward_pre_hooks) for layer in model.model.layers])
        return "ran"

    execute_model.seen = seen

    runner = SimpleNamespace(model=model, execute_model=execute_model)
    cfg = SimpleNamespace(compilation_config=SimpleNamespace(mode=mode))
    return SimpleNamespace(model_runner=runner, vllm_config=cfg), execute_model


@pytest.fixture
def mailbox():
    mb = Mailbox(create_path())
    yield mb
    mb.unlink()


@pytest.mark.parametrize("mode", ["STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE"])
def test_compiled_mode_installs_nothing_and_logs_the_fallback(mailbox, caplog, mode):
    from vllm.config.compilation import CompilationMode

    worker, orig = _worker(getattr(CompilationMode, mode))
    sp = SafePoints(worker, mailbox, min_tokens=1024, block=32)
    with caplog.at_level(logging.WARNING, logger="retire.safepoints"):
        assert sp.install() is False
    assert not sp.installed
    assert all(not layer._forward_pre_hooks for layer in sp.layers)
    assert worker.model_runner.execute_model is orig
    assert any("falls back to the step boundary" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mode", [None, "NONE"])
def test_eager_mode_installs_hooks_negative_control(mailbox, mode):
    from vllm.config.compilation import CompilationMode

    worker, orig = _worker(None if mode is None else CompilationMode.NONE)
    sp = SafePoints(worker, mailbox, min_tokens=1024, block=32)
    assert sp.install() is True and sp.installed
    assert worker.model_runner.execute_model is not orig
    # hooks exist only while an armed step runs: a 2048-token step has one per layer, a decode step none
    assert worker.model_runner.execute_model(_step(2048)) == "ran"
    assert worker.model_runner.execute_model(_step(1)) == "ran"
    assert orig.seen == [[1, 1], [0, 0]]
    assert all(not layer._forward_pre_hooks for layer in sp.layers) and sp.armed is None


def _step(n: int):
    """A SchedulerOutput with one running request scheduled for n tokens (the fields SafePoints reads)."""
    return SimpleNamespace(total_num_scheduled_tokens=n, num_scheduled_tokens={"r": n}, scheduled_new_reqs=[],
                           scheduled_cached_reqs=SimpleNamespace(req_ids=["r"], num_computed_tokens=[0]))


@pytest.mark.slow
def test_compiled_engine_fences_at_the_step_boundary(device, runner):
    from vllm import SamplingParams

    from conformance.fixtures.engines import shape_kwargs
    from conformance.fixtures.prompts import revise, tokens
    from oracles import assert_logprobs_close
    from oracles.runs import OracleEngine, collect
    from retire import RetireEngine
    from retire.barriers import wait_engine

    path, kw = shape_kwargs("long")
    kw.update(enforce_eager=False, max_model_len=4096)
    eng = runner.call(RetireEngine, path, "retire", **kw)
    try:
        async def go():
            prompt = tokens(3000, 71)
            revised = revise(prompt, 1500, 2100, 71)
            sp_old = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
            sp_new = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=5)
            await eng.submit("c", prompt, sp_old)
            info = eng.backend.safe_points
            old = asyncio.ensure_future(collect(eng, "c", 0))
            await wait_engine(eng, "c", frontier=2048)
            tr = await eng.supersede("c", 0, revised, sp_new)
            new = await collect(eng, "c", 1)
            await old
            checks = eng.backend.mailbox.count("checks")
            return info, tr, new, revised, sp_new, checks, await eng.audit()
        info, tr, new, revised, sp_new, checks, audit = runner.run(go())
    finally:
        runner.run(eng.close())
    assert info["active"] is False, info
    assert "compiled" in str(info["workers"]), info
    assert checks == 0  # no safe point ever ran
    assert tr.receipts and all(r.path == "step-boundary" for r in tr.receipts), tr.receipts
    oracle = runner.call(OracleEngine, path, **kw)
    try:
        ref = runner.run(oracle.clean_run(revised, sp_new))
    finally:
        runner.call(oracle.shutdown)
    assert_logprobs_close(subject=new, oracle=ref, subject_name="retire successor (compiled)",
                          oracle_name="clean_run (compiled)")
