"""Shared trial helpers: what the demo, the trace driver, perf and conformance use to build prompts and engine shapes,
run a revision, observe a consumer and judge a successor.

Invariants: this package is packaged product code, so it never imports the unpackaged testbed (`conformance/`,
`perf/`); it may import `oracles` (clean runs, comparators), which the control plane never does
(`conformance/test_layering.py` enforces both). Importing it does not import vLLM.
"""
from .judge import Judge
from .observe import ConsumerClock, Observed, Received, Tick, caught_up, observe
from .prompts import LOW, VOCAB, repo_prompt, revise, tokens, truncate
from .revision import Trial, revision_trial
from .warm import oracle_warmup, reset_prefix_cache, warm_prefill, warmup

__all__ = ["Judge", "ConsumerClock", "Observed", "Received", "Tick", "caught_up", "observe", "LOW", "VOCAB",
           "repo_prompt", "revise", "tokens", "truncate", "Trial", "revision_trial", "oracle_warmup", "reset_prefix_cache",
           "warm_prefill", "warmup"]
