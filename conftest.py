"""Session plumbing shared by conformance/ and perf/: the loop runner, the device parameter, engine pools,
and the audit that runs after every engine test.

- `device` is a session fixture parametrized over "cpu" (marker `cpu`) and "cuda" (marker `gpu`); `pytest -m gpu`
  selects the same guarantees on CUDA runners. The cuda parameter skips, saying so, without a CUDA device; the cpu
  parameter FAILS when vLLM's platform cannot be determined (`device_verdict`), and a CPU engine that cannot start
  errors the test: a CPU guarantee never silently becomes a skip.
- Hangs fail with a stack: pytest-timeout (pyproject: 900 s per test, signal method); tests that legitimately run
  longer or must fail sooner carry `@pytest.mark.timeout(N)`, and the state machine's limit follows its Hypothesis
  profile (`pytest_collection_modifyitems`).
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
    # ci: the default suite (about 2 minutes for the real-engine state machine); soak: `make soak` (about 5 minutes)
    settings.register_profile("ci", max_examples=100, stateful_step_count=20, **_common)
    settings.register_profile("soak", max_examples=1000, stateful_step_count=20, **_common)
    settings.register_profile("dev", max_examples=30, **_common)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # hypothesis is a test extra
    pass


def _platform() -> str:
    """vLLM's own answer to "which device does this build target". Raises if vLLM cannot say (broken install)."""
    from vllm.platforms import current_platform
    return str(current_platform.device_type)


def device_verdict(want: str, probe=_platform, cuda_available=None) -> tuple[str, str]:
    """("run" | "skip" | "fail", reason) for the `device` parameter `want`.

    - cpu: runs on the CPU build. A probe that raises, or a build that targets neither cpu nor cuda, FAILS: a CPU
      guarantee never turns into a skip because vLLM could not be imported or asked (CI must not stay green with
      zero guarantees run). Only a CUDA build (the `gpu` runners) skips the cpu parametrization, saying so.
    - cuda: skips unless a CUDA device and a CUDA build are present; a probe that raises on a machine WITH a CUDA
      device fails.
    """
    if want == "cuda":
        if cuda_available is None:
            import torch
            cuda_available = torch.cuda.is_available()
        if not cuda_available:
            return "skip", ("GPU-only parametrization: no CUDA device on this machine "
                            "(runs under `pytest -m gpu` on CUDA runners)")
    try:
        have = probe()
    except Exception as e:  # noqa: BLE001 - reported, never swallowed into a skip
        return "fail", f"cannot determine vLLM's platform for the {want} guarantees: {e!r}"
    if have == want:
        return "run", ""
    if want == "cpu" and have == "cuda":
        return "skip", "CPU parametrization: the installed vLLM is the CUDA build (run `pytest -m gpu`)"
    if want == "cuda" and have == "cpu":
        return "skip", "GPU-only parametrization: the installed vLLM is the CPU build"
    return "fail", f"the installed vLLM targets {have!r}: the {want} guarantees cannot run"


@pytest.fixture(scope="session", params=[pytest.param("cpu", marks=pytest.mark.cpu),
                                         pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    verdict, reason = device_verdict(request.param)
    if verdict == "skip":
        pytest.skip(reason)
    if verdict == "fail":
        pytest.fail(reason, pytrace=False)
    return request.param


TIMEOUT_BY_PROFILE = {"soak": 3600, "dev": 900, "ci": 600}  # seconds for the real-engine state machine


def pytest_collection_modifyitems(config, items):
    """The state machine's pytest-timeout follows its Hypothesis profile: a CI run that hangs fails within 10
    minutes, a soak (1,000 examples, about 5 minutes) gets an hour."""
    profile = config.getoption("hypothesis_profile", None) or os.environ.get("HYPOTHESIS_PROFILE", "ci")
    for item in items:
        if item.name.startswith("test_retire_state_machine"):
            item.add_marker(pytest.mark.timeout(TIMEOUT_BY_PROFILE.get(profile, 3600)))


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
