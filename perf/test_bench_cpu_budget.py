"""Where the no-revision cost could live: the CPU each process role spends on one trial, retire vs stock vLLM.

Paper metric: Table 11's no-revision cost, decomposed. The wall-time pairs of `test_bench_overhead` cannot resolve
below about 1% (pair sd ~11%); the CPU a process spends is read per thread from the kernel at ns resolution
(perf/cpu_budget.py), so a per-token cost in retire's frontend (the facade's publication gates, the consumer's
stream) shows as a paired difference directly.

Workload and arms are `test_bench_no_revision_vs_stock_vllm`'s, `1k` (1K prompt + 128 decode, `long` model, one
request): the same `_retire_batch` / `_stock_batch` trials, alternating order, the quiescence barrier before each arm,
each retire trial exact against its stock twin. The retire arm's `reset_prefix_cache` round trip before t0 (the stock
arm salts its prompt instead) is budgeted apart (`reset_cpu_ms`), outside the trial's window.

Reported per role (frontend = this process; engine_core; worker; ms per request): medians per arm, the paired
difference retire - stock with a bootstrap 95% interval of its median (2000 resamples, seed 0), the same per decoded
token (µs), and the wall-time ratio for reference. vLLM's engine processes busy-wait on their queues, so their CPU
tracks wall time: their differences say how long the arm ran, not what it computed. Nothing is asserted about
timings.
"""
from __future__ import annotations

import statistics

import pytest

from perf import cpu_budget
from perf.common import Paired, bootstrap_ci, summary
from perf.test_bench_overhead import _paired_round, _retire_batch, _stock_batch
from retire.trials import reset_prefix_cache

pytestmark = pytest.mark.bench

PAIRS = 16
DECODE_TOKENS = 128


def _budgeted(trial, prelude=None):
    """Wrap an arm: run `prelude()` (budgeted apart, as `t.prelude_cpu`), then the trial, and attach the trial's CPU
    budget by role (ms) to the returned trial as `t.cpu`."""
    async def arm(prompts):
        s0 = cpu_budget.snapshot()
        if prelude is not None:
            await prelude()
        s1 = cpu_budget.snapshot()
        t = await trial(prompts)
        t.cpu = cpu_budget.delta(s1, cpu_budget.snapshot())
        t.prelude_cpu = cpu_budget.delta(s0, s1)
        return t
    return arm


def _diff_info(paired: Paired, role: str) -> dict:
    d = [r["retire"].cpu[role] - r["stock"].cpu[role] for r in paired.rounds]
    ci = bootstrap_ci(d, n=2000, seed=0)
    med = statistics.median(d) if d else None
    return {"median_ms": None if med is None else round(med, 3),
            "bootstrap_ci95_ms": [round(x, 3) for x in ci] if ci else None,
            "per_token_us": None if med is None else round(med / DECODE_TOKENS * 1e3, 2)}


def test_bench_cpu_budget_retire_vs_stock(benchmark, facades, pool):
    fs, stock = facades("long", "retire")
    eng = fs["retire"]
    run = pool.runner.run
    paired = Paired(("retire", "stock"))

    async def pair(i: int, record: bool = True):
        arms = {"retire": _budgeted(lambda prompts: _retire_batch(eng, prompts, f"cpu-budget-{i}", reset=False),
                                    prelude=lambda: reset_prefix_cache(eng)),  # fresh scope names per round
                "stock": _budgeted(lambda prompts: _stock_batch(stock, prompts))}
        res = await _paired_round(arms, [1024], i, paired.order(i), subject="retire", reference="stock")
        if record:
            paired.add(i, res)

    run(pair(-1, record=False))  # untimed warm-up pair
    benchmark.pedantic(lambda i: run(pair(i)), setup=paired.setup, rounds=PAIRS, iterations=1)
    assert paired.rounds, paired.admission()
    roles = [r for r in cpu_budget.ROLES if r != "other"]
    info = {"paper_metric": "no-revision cost decomposed: CPU per process role, retire vs stock (Table 11)",
            "model": "long", "workload": "1k: 1024-token prompt + 128-token decode, one request",
            "cpu_resolution": cpu_budget.resolution(), **paired.admission(),
            **{f"cpu_ms[{a}][{role}]": summary((t.cpu[role] for t in paired.values(a, lambda t: t)), 3)
               for a in ("retire", "stock") for role in roles},
            **{f"cpu_diff[retire-stock][{role}]": _diff_info(paired, role) for role in roles},
            "reset_cpu_ms[retire][frontend]": summary((t.prelude_cpu["frontend"] for t in paired.values(
                "retire", lambda t: t)), 3),
            "wall_ratio[retire/stock]": summary(paired.ratios("retire", "stock", lambda t: t.total))}
    benchmark.extra_info.update(info)
    print(f"\n[cpu budget] frontend {info['cpu_diff[retire-stock][frontend]']}, "
          f"engine_core {info['cpu_diff[retire-stock][engine_core]']}, wall {info['wall_ratio[retire/stock]']}")
