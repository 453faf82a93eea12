"""What retire costs when nothing is revised (issue #4: armed guards; issue #6 / paper Table 11: retire vs stock vLLM).

Four kinds of benchmark, each pairing its arms trial by trial in one run (arm order alternating), on the `long` model
with the `long` shape (prefill unit 2048, so a 1K prompt is one armed step and a 4K prompt two):

1. Armed guards: the same "retire" facade with per-layer safe points ARMED (min_tokens 1024: every prefill step of the
   workload is armed, every layer reads the mailbox) vs UNARMED (min_tokens above any step). Decode steps are one
   token and never armed; the 128-token decode is in the figure to show it pays nothing.
2. Retire vs stock: the retire policy on RetireScheduler + RetireWorkerExtension (gates, generation counters, armed
   safe points, the epoch check at dequeue) vs a stock vLLM AsyncLLM with the same execution shape (vLLM's own
   scheduler and worker). Concurrency 1 (1K and 4K prompts) and a mixed batch of 8 concurrent requests (1K and
   256-token prompts alternating). The stock engine is also the oracle: alone, every retire output must equal it
   exactly; in the batch (both arms request logprobs=2), by the logprob-closeness rule.
3. A/A control: a second stock engine instance vs the first, paired the same way. Pairs in (2) share two engine
   instances, so their bootstrap interval misses any systematic difference between instances; (3) measures it.
4. Retire vs stock across instances: (2) on several fresh engine pairs, with a two-stage (instances, then pairs)
   bootstrap interval of the median ratio, the interval a 1% claim needs; and its A/A control, the same design on
   fresh pairs of two stock engines (the interval the design gives when nothing differs).

Metric: submit -> last token (per request; for the batch, the makespan), plus time to first token for
concurrency 1. Reported: medians, [min, max], per-pair ratios (subject / reference) with a percentile bootstrap 95%
interval of the median ratio (2000 resamples, seed 0). Nothing is asserted about timings.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import pytest
from vllm import SamplingParams

from conformance.fixtures.prompts import repo_prompt
from oracles import collect, compare_logprobs_close, compare_tokens
from perf import pairs_ledger, pinning
from perf.quiesce import HARNESS, quiesce
from perf.common import (DEFAULT_SLICES, FINE_SLICES, ROUND_SEED, Paired, bootstrap_ci, bootstrap_ci_nested,
                         round_seeds, summary, warmup_index)
from retire.trials import reset_prefix_cache

pytestmark = pytest.mark.bench

SP = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
SP_BATCH = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True, logprobs=2)
PAIRS = 12
UNARMED = 10 ** 9


class Timed:
    def __init__(self, runs, total: float, first: float | None, ok: bool = True, verdict: str = ""):
        self.runs, self.total, self.first, self.ok, self.verdict = runs, total, first, ok, verdict


def _ratio_info(ratios: list[float]) -> dict:
    ci = bootstrap_ci(ratios, n=2000, seed=0)
    return {**summary(ratios), "overhead_pct_median": round((statistics.median(ratios) - 1) * 100, 2) if ratios
            else None, "bootstrap_ci95_of_median": [round(x, 4) for x in ci] if ci else None}


async def _retire_batch(eng, prompts, tag: str, *, reset: bool = True) -> Timed:
    """`reset=False`: the caller has reset the prefix cache itself (the CPU budget times that call apart)."""
    sp = SP if len(prompts) == 1 else SP_BATCH
    if reset:
        await reset_prefix_cache(eng)
    t0 = time.monotonic()
    scopes = [f"{tag}-{k}" for k in range(len(prompts))]
    # submitted concurrently, as the stock arm's gathered generate() calls are: one by one, EngineCore would start a
    # step with the first request alone while the others are still being submitted
    await asyncio.gather(*(eng.submit(s, p, sp) for s, p in zip(scopes, prompts)))
    submitted = time.monotonic() - t0
    runs = await asyncio.gather(*(collect(eng, s) for s in scopes))
    total = time.monotonic() - t0
    # from t0, as the stock arm's (collect's own clock starts after the submit; before 2026-12-02 this figure
    # left the submit out, which favoured retire in every retire/stock TTFT ratio)
    ff = runs[0].timings.get("first_frame") if len(runs) == 1 else None
    return Timed(runs, total, None if ff is None else submitted + ff)


async def _stock_batch(stock, prompts) -> Timed:
    t0 = time.monotonic()
    sp = SP if len(prompts) == 1 else SP_BATCH
    runs = await asyncio.gather(*(stock.clean_run(p, sp) for p in prompts))
    total = time.monotonic() - t0
    first = runs[0].timings.get("first_frame") if len(runs) == 1 else None
    return Timed(runs, total, first)


async def _set_min_tokens(eng, n: int) -> None:
    infos = await eng.backend.worker("retire_install_safe_points", n, eng.backend.block_size)
    assert all(i["active"] for i in infos), infos


def _paired_settings(benchmark, eng, oracle, run, prompt_len: int, settings: dict, count, seed: int) -> Paired:
    """Paired rounds of ONE retire engine under two settings: per round one fresh prompt, each arm (order
    alternating) applies its setting (`await settings[arm]()`) and runs it alone; every trial must equal the stock
    oracle's clean run exactly (same execution shape); `await count()` before and after gives the trial's `checks`
    (safe points reached, slices run: the structural proof that the setting took effect)."""
    paired = Paired(tuple(settings))
    refs: dict = {}

    async def one(arm: str, prompt, tag: str) -> Timed:
        await settings[arm]()
        c0 = await count()
        t = await _retire_batch(eng, [prompt], tag)
        t.checks = await count() - c0
        v = compare_tokens(subject=t.runs[0], oracle=refs[tuple(prompt)], subject_name=f"retire ({arm})",
                           oracle_name="stock clean_run")
        t.ok, t.verdict = bool(v), v.detail
        return t

    async def pair(i: int, record: bool = True):
        prompt = repo_prompt(prompt_len, seed=seed + prompt_len + i)
        refs[tuple(prompt)] = await oracle.clean_run(prompt, SP)
        res = {a: await one(a, prompt, f"g{seed}-{prompt_len}-{i}-{a}") for a in paired.order(i)}
        if record:
            paired.add(i, res)

    run(pair(-1, record=False))  # untimed warm-up pair
    benchmark.pedantic(lambda i: run(pair(i)), setup=paired.setup, rounds=PAIRS, iterations=1)
    assert paired.rounds, paired.admission()
    return paired


def _cost_info(paired: Paired, subject: str, reference: str) -> dict:
    total, first = (lambda t: t.total), (lambda t: t.first)
    decode = lambda t: t.total - t.first if t.first is not None else None
    arms = (subject, reference)
    return {**paired.admission(),
            **{f"request_latency_s[{a}]": summary(paired.values(a, total)) for a in arms},
            **{f"ttft_s[{a}]": summary(paired.values(a, first)) for a in arms},
            f"cost_ratio_total[{subject}/{reference}]": _ratio_info(paired.ratios(subject, reference, total)),
            f"cost_ratio_ttft[{subject}/{reference}]": _ratio_info(paired.ratios(subject, reference, first)),
            f"cost_ratio_decode[{subject}/{reference}]": _ratio_info(paired.ratios(subject, reference, decode))}


@pytest.mark.parametrize("prompt_len", [1024, 4096])
def test_bench_armed_guards_cost(benchmark, facades, pool, prompt_len):
    fs, oracle = facades("long", "retire")
    eng = fs["retire"]

    async def checks() -> int:
        return eng.backend.mailbox.count("checks")

    settings = {"armed": lambda: _set_min_tokens(eng, 1024), "unarmed": lambda: _set_min_tokens(eng, UNARMED)}
    try:
        paired = _paired_settings(benchmark, eng, oracle, pool.runner.run, prompt_len, settings, checks, 3000)
    finally:
        pool.runner.run(_set_min_tokens(eng, eng.backend.safe_point_min_tokens))
    # structural: the armed arm really checked at safe points, the unarmed arm never did
    assert all(r["armed"].checks > 0 and r["unarmed"].checks == 0 for r in paired.rounds), \
        [(r["armed"].checks, r["unarmed"].checks) for r in paired.rounds]
    benchmark.extra_info.update({
        "paper_metric": "no-revision cost of armed safe points", "model": "long",
        "workload": f"{prompt_len}-token prefill + 128-token decode, concurrency 1",
        "safe_point_checks_per_request[armed]": summary(paired.values("armed", lambda t: t.checks), 0),
        **_cost_info(paired, "armed", "unarmed")})
    print(f"\n[armed guards] {prompt_len}: total ratio {benchmark.extra_info['cost_ratio_total[armed/unarmed]']}")


@pytest.mark.parametrize("prompt_len", [4096, 8192])
def test_bench_fine_safe_points_cost(benchmark, facades, pool, prompt_len):
    """The no-revision cost of safe points inside the attention and the MLP of every armed step from 2048 tokens,
    512 tokens per slice (the fine tier of retire/density.py, which the engine runs while revisions arrive; here
    forced for every step: `safe_point_slice_min_tokens=2048, safe_point_slice_rows=512`, density window 0) against
    the static defaults (from 8192 tokens, 1024 per slice). The long shape's prefill steps
    are 2048 tokens, so the default arm runs them unsliced (layer + MLP safe points) and the fine arm in 4 slices per
    attention and MLP; both arms armed (min_tokens 1024). Sliced is bit-identical, so both are exact against the
    oracle."""
    fs, oracle = facades("long", "retire")
    eng = fs["retire"]
    slicing = lambda *a: eng.backend.worker("retire_slicing", *a)

    async def slices() -> int:
        r = (await slicing())[0]
        return r["sliced_calls"] + r.get("mlp", {}).get("split_calls", 0)

    # both arms with the density rule off (window 0), so the tier each arm names is the one every step runs
    settings = {"fine": lambda: slicing(True, *FINE_SLICES, 0.0),
                "default": lambda: slicing(True, *DEFAULT_SLICES, 0.0)}
    run = pool.runner.run
    run(_set_min_tokens(eng, 1024))
    try:
        paired = _paired_settings(benchmark, eng, oracle, run, prompt_len, settings, slices, 5000)
    finally:
        run(slicing(None, *eng.backend.slicing_defaults()))
        run(_set_min_tokens(eng, eng.backend.safe_point_min_tokens))
    assert all(r["fine"].checks > 0 and r["default"].checks == 0 for r in paired.rounds), \
        [(r["fine"].checks, r["default"].checks) for r in paired.rounds]
    benchmark.extra_info.update({
        "paper_metric": "no-revision cost of safe points inside attention and MLP (issue 14 section 2)",
        "model": "long", "workload": f"{prompt_len}-token prefill (2048-token steps) + 128-token decode, concurrency 1",
        "slices": {"fine": FINE_SLICES, "default": DEFAULT_SLICES, "as": "(min_tokens, tokens per slice)"},
        "sliced_calls_per_request[fine]": summary(paired.values("fine", lambda t: t.checks), 0),
        **_cost_info(paired, "fine", "default")})
    print(f"\n[fine safe points] {prompt_len}: total ratio {benchmark.extra_info['cost_ratio_total[fine/default]']}")


WORKLOADS = {
    "1K-c1": [1024],
    "4K-c1": [4096],
    "mixed-8": [1024, 256] * 4,
}


async def _paired_round(arms: dict, lens: list[int], i: int, order: list[str], *, subject: str, reference: str,
                        seed: int = ROUND_SEED) -> dict:
    """One paired round: `arms[a](prompts)` for each arm in `order`, on the same prompts. The `subject` trial carries
    the verdict against `reference`: alone, the same execution shape, so exact; batched, the batch composition per step
    may differ between the engines (CPU kernels are not batch-invariant), so the logprob-closeness rule applies."""
    prompts = [repo_prompt(n, seed=s) for n, s in zip(lens, round_seeds(i, len(lens), seed))]
    res = {}
    for a in order:
        await quiesce()  # the other arm's engine stops spinning first (perf/quiesce.py)
        res[a] = await arms[a](prompts)
    cmp = compare_tokens if len(lens) == 1 else compare_logprobs_close
    vs = [cmp(subject=x, oracle=y, subject_name=subject, oracle_name=reference)
          for x, y in zip(res[subject].runs, res[reference].runs)]
    bad = [(k, v.detail) for k, v in enumerate(vs) if not v]
    res[subject].ok = not bad
    res[subject].verdict = f"requests differ from {reference}: {bad[:2]}" if bad else f"matches {reference}"
    return res


async def _retire_stock_pair(eng, stock, lens: list[int], i: int, order: list[str], tag: str) -> dict:
    """One paired round, retire facade vs stock engine, arms in `order`."""
    arms = {"retire": lambda prompts: _retire_batch(eng, prompts, tag),
            "stock": lambda prompts: _stock_batch(stock, prompts)}
    return await _paired_round(arms, lens, i, order, subject="retire", reference="stock")


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_bench_no_revision_vs_stock_vllm(benchmark, facades, pool, workload):
    fs, stock = facades("long", "retire")
    eng = fs["retire"]
    run = pool.runner.run
    arms = ("retire", "stock")
    paired = Paired(arms)
    lens = WORKLOADS[workload]

    async def pair(i: int, record: bool = True):
        res = await _retire_stock_pair(eng, stock, lens, i, paired.order(i), f"s{workload}-{i}")
        if record:
            paired.add(i, res)

    run(pair(-1, record=False))  # untimed warm-up pair
    benchmark.pedantic(lambda i: run(pair(i)), setup=paired.setup, rounds=PAIRS, iterations=1)
    assert paired.rounds, paired.admission()
    total = lambda t: t.total
    info = {"paper_metric": "no-revision cost: retire policy vs stock vLLM (Table 11)", "model": "long",
            "workload": workload, "prompt_lens": lens, "decode_tokens": 128, **paired.admission(),
            **{f"latency_s[{a}]": summary(paired.values(a, total)) for a in arms},
            "cost_ratio[retire/stock]": _ratio_info(paired.ratios("retire", "stock", total))}
    if len(lens) == 1:
        info.update({f"ttft_s[{a}]": summary(paired.values(a, lambda t: t.first)) for a in arms})
        info["cost_ratio_ttft[retire/stock]"] = _ratio_info(paired.ratios("retire", "stock", lambda t: t.first))
    benchmark.extra_info.update(info)
    print(f"\n[vs stock] {workload}: {info['cost_ratio[retire/stock]']}")


class _PlainRequests:
    """vLLM's own `generate` on the retire engine's AsyncLLM: requests with no retire tag, which the RetireScheduler
    hands to vLLM's Scheduler unchanged. The worker is the same (an armed step is armed for them too)."""

    def __init__(self, llm):
        self.llm = llm

    async def clean_run(self, prompt, sampling):
        import uuid

        from oracles.runs import OracleEngine
        return await OracleEngine._generate(self, prompt, sampling, f"plain-{uuid.uuid4().hex}", skip_cache=True)


def test_bench_facade_vs_plain_requests_same_engine(benchmark, facades, pool):
    """Where a no-revision cost could live, without the instance effect: ONE retire engine, two arms paired per
    round (alternating order, quiescence barrier, exact against each other): the retire facade (`submit` + `stream`,
    a tagged request, the publication gates; its prefix-cache reset before the clock as in the Table 11 arm) against
    plain vLLM requests on the same AsyncLLM (`generate`, salted like the stock arm). Both run the same worker, so
    a difference is the facade's and the scheduler's per-request work; a cost seen against stock vLLM but not here
    lives in the engine build (or the instance). 1K prompt + 128 decode, `long`. Nothing is asserted about timings."""
    fs, _ = facades("long", "retire")
    eng = fs["retire"]
    plain = _PlainRequests(eng.backend.llm)
    run = pool.runner.run
    paired = Paired(("retire", "plain"))

    async def pair(i: int, record: bool = True):
        batches = {"retire": lambda prompts: _retire_batch(eng, prompts, f"fp{i}"),
                   "plain": lambda prompts: _stock_batch(plain, prompts)}
        res = await _paired_round(batches, [1024], i, paired.order(i), subject="retire", reference="plain",
                                  seed=6000)
        if record:
            paired.add(i, res)

    run(pair(-1, record=False))  # untimed warm-up pair
    benchmark.pedantic(lambda i: run(pair(i)), setup=paired.setup, rounds=PAIRS, iterations=1)
    assert paired.rounds, paired.admission()
    benchmark.extra_info.update({
        "paper_metric": "no-revision cost decomposed: retire facade vs plain vLLM requests on one retire engine",
        "model": "long", "workload": "1K prompt + 128 decode, concurrency 1", **_cost_info(paired, "retire", "plain")})
    print(f"\n[facade vs plain] total {benchmark.extra_info['cost_ratio_total[retire/plain]']}, ttft "
          f"{benchmark.extra_info['cost_ratio_ttft[retire/plain]']}")


def _stock_arms(b, a) -> dict:
    """The A/A arms: stock engine instance `b` ("stock-B", the subject) and `a` ("stock-A", the reference)."""
    return {"stock-B": lambda prompts: _stock_batch(b, prompts), "stock-A": lambda prompts: _stock_batch(a, prompts)}


@pytest.mark.parametrize("workload", ["1K-c1", "4K-c1"])
def test_bench_stock_vs_stock_instance_control(benchmark, facades, pool, workload):
    """A/A control for the retire-vs-stock comparison: a SECOND stock engine instance with the same shape, paired with
    the first exactly as above (same prompts, alternating order, exact token comparison).

    The pairs of `test_bench_no_revision_vs_stock_vllm` all share the same two engine instances, so its bootstrap
    interval covers trial-to-trial noise only. Two instances of the same stock engine differ systematically too
    (process and KV-cache placement, thread binding): this benchmark measures that instance effect. A retire / stock
    ratio whose distance from 1 is within the A/A ratio's distance from 1 is not a measured cost of retire."""
    _, stock = facades("long", "retire")  # evicts other shapes; `stock` is the pool's oracle instance ("A")
    run = pool.runner.run
    second = pool.start_oracle("long")  # instance "B", stopped below
    arms = ("stock-B", "stock-A")
    paired = Paired(arms)
    lens = WORKLOADS[workload]
    batches = _stock_arms(second, stock)

    async def pair(i: int, record: bool = True):
        res = await _paired_round(batches, lens, i, paired.order(i), subject="stock-B", reference="stock-A", seed=5000)
        if record:
            paired.add(i, res)

    try:
        run(pair(-1, record=False))  # untimed warm-up pair (B's first logprobs-free run)
        benchmark.pedantic(lambda i: run(pair(i)), setup=paired.setup, rounds=PAIRS, iterations=1)
    finally:
        pool.stop_oracle(second)
    assert paired.rounds, paired.admission()
    total, first = (lambda t: t.total), (lambda t: t.first)
    info = {"paper_metric": "A/A control: stock vLLM instance B vs instance A (no retire)", "model": "long",
            "workload": workload, "prompt_lens": lens, "decode_tokens": 128, **paired.admission(),
            **{f"latency_s[{a}]": summary(paired.values(a, total)) for a in arms},
            **{f"ttft_s[{a}]": summary(paired.values(a, first)) for a in arms},
            "cost_ratio[stock-B/stock-A]": _ratio_info(paired.ratios("stock-B", "stock-A", total)),
            "cost_ratio_ttft[stock-B/stock-A]": _ratio_info(paired.ratios("stock-B", "stock-A", first))}
    benchmark.extra_info.update(info)
    print(f"\n[A/A stock instances] {workload}: {info['cost_ratio[stock-B/stock-A]']}")


# instance pairs per workload in `make bench`: 16 for 1K-c1 (the reference run's nested interval over them was 7.6%
# wide; 2% needs about 1,400 pairs, accumulated across runs by `make no-revision-ci` in the ledger below), 4 for
# mixed-8. `RETIRE_INSTANCES` overrides both.
INSTANCES = {w: int(os.environ.get("RETIRE_INSTANCES", n)) for w, n in (("1K-c1", "16"), ("mixed-8", "4"))}
# when set (`make no-revision-ci`), every finished instance pair is appended to this ledger and the interval is
# computed over all of its lines of the current code (perf/pairs_ledger.py)
LEDGER = os.environ.get("RETIRE_PAIRS_LEDGER", "")
# paired rounds per fresh instance pair (`RETIRE_PAIRS_PER_INSTANCE`, `make no-revision-ci PAIRS=...`). The instance
# effect is small next to the rounds' own spread (EPYC, 24 rounds: instance medians sd 3.2% against 2.7% from the
# rounds alone; the one effect found is the start order, which alternating balances), so more rounds per start buy
# pairs at a fraction of the cost: an instance pair's two starts, warm-ups and shutdowns take about 70 s, a round 8 s
PAIRS_PER_INSTANCE = int(os.environ.get("RETIRE_PAIRS_PER_INSTANCE", "6"))
# the across-instance tests' timeout: about 90 s per instance pair plus 10 s per round, at least an hour
ACROSS_TIMEOUT = max(3600, max(INSTANCES.values()) * (90 + 10 * PAIRS_PER_INSTANCE),
                     int(os.environ.get("RETIRE_AA_INSTANCES", "0")) * (90 + 10 * PAIRS_PER_INSTANCE))
# the ledger's harness label: the quiescence barrier, and the start order alternating per instance pair (odd pairs
# start the reference engine first), which the series of 2026-12-02 ("quiesce-1") did not do: there the subject
# always started first, and both the retire/stock and the A/A instance medians climbed within each run; and, from
# 2026-12-03, the frontend and EngineCores kept off the workers' core while an instance pair runs (perf/pinning.py)
LEDGER_HARNESS = "/".join(x for x in (HARNESS, "alt-start", pinning.HARNESS) if x)


@dataclass(frozen=True)
class _Instances:
    """How `_across_instances` starts, runs and stops one fresh instance pair: `names` = (subject, reference), the
    ratio is subject / reference; `start(reference_first)` -> the two engines as (subject, reference), started in that
    order (untimed, warmed); `round(engines, i, order, tag)` -> one paired round's trials; `stop(engines)`; `ledger`
    = the ledger's workload key for these arms."""
    names: tuple[str, str]
    start: Callable[[bool], tuple]
    round: Callable[..., Awaitable[dict]]
    stop: Callable[[tuple], None]
    ledger: str
    metric: str


def _retire_stock_instances(pool, bench_engines, lens: list[int], workload: str) -> _Instances:
    def start(reference_first: bool):
        if reference_first:
            stock = pool.start_oracle("long")
            eng = pool.start_subject("long")
        else:
            eng, stock = pool.start_subject("long"), pool.start_oracle("long")
        bench_engines.warm(eng, stock)
        return eng, stock

    def stop(engs):
        pool.stop_subject(engs[0])
        pool.stop_oracle(engs[1])

    return _Instances(("retire", "stock"), start,
                      lambda e, i, order, tag: _retire_stock_pair(e[0], e[1], lens, i, order, tag), stop, workload,
                      "no-revision cost: retire vs stock vLLM over several engine instances (Table 11)")


def _stock_stock_instances(pool, lens: list[int], workload: str) -> _Instances:
    from retire.trials import oracle_warmup

    def start(reference_first: bool):
        a, b = pool.start_oracle("long"), pool.start_oracle("long")
        engs = (b, a) if reference_first else (a, b)  # (subject "stock-B", reference "stock-A")
        for e in engs:
            pool.runner.run(oracle_warmup(e))
        return engs

    def stop(engs):
        for e in engs:
            pool.stop_oracle(e)

    def round_(e, i, order, tag):
        return _paired_round(_stock_arms(*e), lens, i, order, subject="stock-B", reference="stock-A")

    return _Instances(("stock-B", "stock-A"), start, round_, stop, f"{workload}/stock-stock",
                      "A/A control over several fresh pairs of stock vLLM instances (no retire)")


@pytest.mark.timeout(ACROSS_TIMEOUT)  # 16 fresh engine pairs x 6 rounds: about 2 min per pair measured
@pytest.mark.parametrize("workload", ["1K-c1", "mixed-8"])
def test_bench_no_revision_vs_stock_across_instances(benchmark, facades, pool, bench_engines, workload):
    """Table 11 at the resolution its 1% target needs: INSTANCES fresh (retire, stock) engine pairs, started in the
    untimed pedantic setup, PAIRS_PER_INSTANCE paired rounds on each (plus one untimed warm-up pair), and a two-stage
    bootstrap of the median ratio (instances, then pairs within them: `bootstrap_ci_nested`). The flat interval over
    the same ratios is recorded next to it; the difference is the instance effect the single-instance benchmark cannot
    see. `INSTANCES[workload]` is the number of instance pairs (`RETIRE_INSTANCES` overrides it)."""
    facades("long")  # evicts every other shape's engines; the pool's own long pair stays idle
    _across_instances(benchmark, pool, workload, _retire_stock_instances(pool, bench_engines, WORKLOADS[workload],
                                                                         workload))


@pytest.mark.timeout(ACROSS_TIMEOUT)
def test_bench_stock_vs_stock_across_instances(benchmark, facades, pool):
    """The A/A control of the test above, with the same design: INSTANCES fresh pairs of two stock engines, the same
    rounds, prompts and nested interval. Its interval is what the design reports when there is no cost at all, so
    retire's upper bound is read next to this one's. `make no-revision-ci` runs it after the retire pairs
    (`AA_INSTANCES`); its pairs go to the same ledger under the workload key `1K-c1/stock-stock`."""
    facades("long")
    _across_instances(benchmark, pool, "1K-c1", _stock_stock_instances(pool, WORKLOADS["1K-c1"], "1K-c1"),
                      instances=int(os.environ.get("RETIRE_AA_INSTANCES", INSTANCES["1K-c1"])))


def _across_instances(benchmark, pool, workload: str, inst: _Instances, instances: int | None = None) -> None:
    """`instances` fresh pairs of `inst`, PAIRS_PER_INSTANCE paired rounds each; the figures go to extra_info."""
    instances = instances or INSTANCES[workload]
    run = pool.runner.run
    lens = WORKLOADS[workload]
    subject, reference = inst.names
    paired = Paired(inst.names)
    live: dict = {}
    instance_of: list[int] = []  # instance index of each admitted round
    session = time.strftime("%Y%m%dT%H%M%S")
    # the code measured, read once before the first pair: the served digest pools, the full one is recorded with it
    code, full = (pairs_ledger.served_digest(), pairs_ledger.code_digest()) if LEDGER else ("", "")
    host = pairs_ledger.host_class() if LEDGER else None  # and the machine class: pairs pool only within one
    cpu = pairs_ledger.cpu_id() if LEDGER else None  # the CPU under the class: recorded, not pooled on
    total = lambda t: t.total

    def groups(metric=total) -> list[list[float]]:
        """Admitted subject/reference ratios of `metric` per instance index."""
        ratios = paired.ratios(subject, reference, metric)
        return [[r for r, k in zip(ratios, instance_of) if k == j] for j in range(instances)]

    def stop() -> None:
        if (placed := live.pop("pinned", None)) is not None:
            placed.close()  # before the next pair starts: its workers pick their cores from the whole machine
        engs = live.pop("engs", None)
        if engs is not None:
            inst.stop(engs)

    def same_code() -> None:
        """Each instance pair imports the retire modules afresh, so a file edited during the run would be measured
        under the digest read at its start: refuse to start a pair or append a line once the code has changed."""
        if LEDGER and (now := (pairs_ledger.served_digest(), pairs_ledger.code_digest())) != (code, full):
            raise RuntimeError(f"the retire code changed during the run (digests {code}/{full} -> {now[0]}/{now[1]});"
                               " the finished instances are in the ledger; commit or stash the change, then run again")

    def setup():
        args, kwargs = paired.setup()
        k = args[0] // PAIRS_PER_INSTANCE
        if live.get("k") != k:
            stop()
            same_code()
            print(f"\n[instances] {inst.ledger}: starting engine pair {k + 1}/{instances}", flush=True)
            live["engs"], live["k"] = inst.start(k % 2 == 1), k
            live["pinned"] = contextlib.ExitStack()
            live["pinned"].enter_context(pinning.pinned())
            run(inst.round(live["engs"], warmup_index(k), list(inst.names), f"x{workload}-w{k}"))  # untimed warm-up
        return args, kwargs

    def target(i: int) -> None:
        res = run(inst.round(live["engs"], i, paired.order(i), f"x{workload}-{i}"))
        if paired.add(i, res):
            instance_of.append(live["k"])
        if LEDGER and i % PAIRS_PER_INSTANCE == PAIRS_PER_INSTANCE - 1 and (mine := groups()[live["k"]]):
            same_code()  # an edit while this pair ran: its line is not appended
            ttft = groups(lambda t: t.first)[live["k"]] if len(lens) == 1 else None  # prefill, apart from decode
            _ledger_append((code, full), (host, cpu), inst.ledger, f"{session}-{live['k']}", mine, ttft=ttft,
                           start_order="reference-first" if live["k"] % 2 else "subject-first")

    try:
        benchmark.pedantic(target, setup=setup, rounds=instances * PAIRS_PER_INSTANCE, iterations=1)
    finally:
        stop()
    assert paired.rounds, paired.admission()
    ttft = groups(lambda t: t.first) if len(lens) == 1 else []
    _instances_info(benchmark, paired, groups(), inst, workload, instances, code, host, ttft)


def _instances_info(benchmark, paired: Paired, per_instance: list, inst: _Instances, workload: str, instances: int,
                    code: str, host: str | None, per_instance_ttft: list) -> None:
    subject, reference = inst.names
    total = lambda t: t.total
    ratios = paired.ratios(subject, reference, total)
    nested = bootstrap_ci_nested(per_instance, n=2000, seed=0)
    key = f"cost_ratio[{subject}/{reference}]"
    info = {"paper_metric": inst.metric, "model": "long", "workload": workload, "prompt_lens": WORKLOADS[workload],
            "decode_tokens": 128, "instances": instances, "pairs_per_instance": PAIRS_PER_INSTANCE,
            **paired.admission(), **{f"latency_s[{a}]": summary(paired.values(a, total)) for a in inst.names},
            key: {**_ratio_info(ratios),
                  "nested_bootstrap_ci95_of_median": [round(x, 4) for x in nested] if nested else None},
            "instance_median_ratios": [round(statistics.median(g), 4) for g in per_instance if g],
            "instance_median_ttft_ratios": [round(statistics.median(g), 4) for g in per_instance_ttft if g],
            "start_order": "alternating per instance pair: even pairs start the subject first, odd the reference"}
    if LEDGER:
        info["ledger"] = {"path": LEDGER, "harness": LEDGER_HARNESS, "host": host,
                          **pairs_ledger.pooled(LEDGER, code=code, workload=inst.ledger, harness=LEDGER_HARNESS,
                                                host=host)}
    benchmark.extra_info.update(info)
    print(f"\n[{subject} vs {reference}, {instances} instance pairs] {workload}: {info[key]}; "
          f"per instance {info['instance_median_ratios']}" + (f"\n[ledger] {inst.ledger}: {info['ledger']}" if LEDGER
                                                              else ""))


def _ledger_append(digests: tuple[str, str], machine: tuple[str | None, str | None], workload: str, instance: str,
                   ratios: list[float], *, ttft: list[float] | None, start_order: str) -> None:
    """One finished instance pair into the resumable ledger (perf/pairs_ledger.py), then the pooled interval. The
    ratios are of the whole request (submit -> last token); `ttft_ratios`, of the time to first token. `digests` =
    (served, full); `machine` = (host class, cpu id)."""
    code, full = digests
    host, cpu = machine
    rec = {"served": code, "code": full, "workload": workload, "instance": instance,
           "ratios": [round(r, 6) for r in ratios],
           "model": "long", "decode_tokens": 128, "harness": LEDGER_HARNESS, "host": host, "cpu": cpu,
           "start_order": start_order, "pairs_per_instance": PAIRS_PER_INSTANCE}
    if ttft:
        rec["ttft_ratios"] = [round(r, 6) for r in ttft]
    pairs_ledger.append(LEDGER, rec)
    print(f"\n[ledger] {workload}: "
          f"{pairs_ledger.pooled(LEDGER, code=code, workload=workload, harness=LEDGER_HARNESS, host=host)}",
          flush=True)
