"""Warm-up and cache reset shared by the demo, perf and the conformance engine pool.

Invariant: warm-ups are untimed and leave nothing behind (their scopes run to completion); after
`reset_prefix_cache` returned True no block of an earlier trial can be reused through the prefix cache.
"""
from __future__ import annotations


async def reset_prefix_cache(eng) -> bool:
    """Start a trial from an empty prefix cache, so one arm never reuses another arm's blocks."""
    return bool(await eng.backend.reset_prefix_cache())


async def warmup(eng) -> None:
    """Pay the one-time logprobs compile and first-step costs before anything is measured."""
    from vllm import SamplingParams

    from oracles.runs import collect

    await eng.submit("__warmup__", list(range(3, 3 + 40)), SamplingParams(max_tokens=4, temperature=0, ignore_eos=True,
                                                                           logprobs=2))
    await collect(eng, "__warmup__")


async def warm_prefill(eng, chunk: int) -> None:
    """One full prefill unit and a decode step, so first-shape costs stay out of the figures."""
    from vllm import SamplingParams

    from oracles.runs import collect

    from .prompts import repo_prompt

    scope = f"__warm_prefill_{chunk}__"
    await eng.submit(scope, repo_prompt(chunk + 64, 4242), SamplingParams(max_tokens=2, temperature=0,
                                                                          ignore_eos=True))
    await collect(eng, scope)


async def oracle_warmup(oracle) -> None:
    """The oracle engine's logprobs compile."""
    from vllm import SamplingParams

    await oracle.clean_run(list(range(3, 43)), SamplingParams(max_tokens=4, temperature=0, ignore_eos=True,
                                                              logprobs=2))
