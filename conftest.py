"""Session plumbing shared by conformance/ and perf/: the loop runner, the device parameter, engine pools,
and the audit that runs after every engine test.

- `device` is a session fixture parametrized over "cpu" (marker `cpu`) and "cuda" (marker `gpu`); `pytest -m gpu`
  selects the same guarantees on CUDA runners. A parameter whose device is absent skips with a reason saying so.
- `unit` / `long` hand a test a Harness: facades for every policy on ONE engine configuration, its oracle, and
  `h.run(coro)`. At teardown every facade is drained and audited; a leak fails the test.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    from hypothesis import HealthCheck, settings

    _common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    settings.register_profile("ci", max_examples=12, stateful_step_count=12, **_common)
    settings.register_profile("soak", max_examples=1000, stateful_step_count=20, **_common)
    settings.register_profile("dev", max_examples=30, **_common)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # hypothesis is a test extra
    pass


def _platform() -> str:
    try:
        from vllm.platforms import current_platform
        return str(current_platform.device_type)
    except Exception:  # noqa: BLE001
        return "unknown"


@pytest.fixture(scope="session", params=[pytest.param("cpu", marks=pytest.mark.cpu),
                                         pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    want = request.param
    have = _platform()
    if want == "cuda":
        import torch
        if not torch.cuda.is_available() or have != "cuda":
            pytest.skip("GPU-only parametrization: no CUDA device / CUDA vLLM build on this machine "
                        "(runs under `pytest -m gpu` on CUDA runners)")
    elif have != "cpu":
        pytest.skip(f"CPU parametrization: the installed vLLM targets {have!r}, not the CPU build")
    return want


@pytest.fixture(scope="session")
def runner():
    from conformance.fixtures.runner import LoopRunner

    r = LoopRunner()
    yield r
    r.close()


@pytest.fixture(scope="session")
def pool(runner):
    """Engines by configuration key. Not keyed by `device`: a switch of the device parameter must not tear the
    engines down (the `cuda` cases skip before they ask for one)."""
    from conformance.fixtures.engines import EnginePool

    p = EnginePool(runner)
    _LIVE_POOLS.append(p)
    yield p
    _LIVE_POOLS.remove(p)
    p.close()


_LIVE_POOLS: list = []
KEEP_ACROSS_MODULES = ("unit",)  # the shape most modules use; every other engine lives for one module at most


@pytest.fixture(scope="module", autouse=True)
def _release_module_engines():
    """Memory bound for a full run (24 GiB, ~2.5 GB per engine): at the end of every test module, shut down every
    subject engine except the shared `unit` one (and its oracle, unless a live subject shares it). A later module
    that needs a shape again starts it again (~15 s)."""
    yield
    for p in _LIVE_POOLS:
        for key in [k for k in p.subjects if k not in KEEP_ACROSS_MODULES]:
            p.release(key)


class Harness:
    def __init__(self, runner, base, oracle_factory):
        from retire.engine import POLICIES

        self.runner = runner
        self.base = base
        self._oracle_factory = oracle_factory
        self.engines = {p: base.with_policy(p) for p in POLICIES}
        self.retire = self.engines["retire"]
        self.native_cold = self.engines["native-cold"]
        self.native_prefix = self.engines["native-prefix"]

    @property
    def oracle(self):
        return self._oracle_factory()

    def run(self, aw, timeout: float | None = 900):
        return self.runner.run(aw, timeout)

    def facade(self, policy: str):
        eng = self.base.with_policy(policy)
        self.engines[f"{policy}#{len(self.engines)}"] = eng
        return eng

    def teardown(self):
        async def _fin():
            reports = []
            live = [e for e in self.engines.values() if not e.closed]
            for eng in live:
                eng.seams.reset()
                await eng.drain()
            await self.base.reset_seams()
            for eng in live:
                reports.append(await eng.audit())
                await eng.close()
            return reports
        return self.run(_fin())


def _harness(pool, key):
    h = Harness(pool.runner, pool.subject(key), lambda: pool.oracle(key))
    yield h
    h.teardown()


@pytest.fixture
def unit(device, pool):
    yield from _harness(pool, "unit")


@pytest.fixture
def unit_noapc(device, pool):
    yield from _harness(pool, "unit-noapc")


@pytest.fixture
def long(device, pool):
    yield from _harness(pool, "long")


@pytest.fixture
def long8k(device, pool):
    h = None
    for h in _harness(pool, "long-8k"):
        yield h
        h.run(h.base.backend.sched("set_step_tokens", {"tokens": None}))
        h.run(h.base.backend.sched("reset_switches"))


@pytest.fixture
def spec(device, pool):
    """ngram speculative decoding (3 draft tokens) on the unit model; its oracle has the same speculative config."""
    yield from _harness(pool, "unit-spec")


@pytest.fixture
def hybrid(device, pool):
    """Two KV groups: the Gemma3-shaped model (sliding window 128 + full attention)."""
    yield from _harness(pool, "hybrid")


@pytest.fixture
def tp2(device, pool):
    """Tensor parallel 2 (mp executor, one rank per core); its oracle is a stock TP=2 engine."""
    yield from _harness(pool, "unit-tp2")
