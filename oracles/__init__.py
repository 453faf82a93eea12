"""Clean reference executions and comparators. Oracles never read state through the code under test: they run on a
stock vLLM engine (no retire scheduler, no retire metadata) with the same execution shape as the subject."""
from .compare import Verdict, assert_logprobs_close, assert_same_tokens, compare_logprobs_close, compare_tokens
from .runs import Run, collect

__all__ = ["Run", "collect", "Verdict", "compare_tokens", "compare_logprobs_close", "assert_same_tokens",
           "assert_logprobs_close"]
