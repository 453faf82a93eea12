"""Negative controls for the comparators: a perturbed side must be reported as different, naming both sides."""
from oracles import Run, compare_logprobs_close, compare_tokens
import pytest

from oracles.compare import assert_logprobs_close, assert_same_tokens

BASE = Run(tokens=(5, 6, 7, 8), logprobs=(-0.1, -0.2, -0.3, -0.4),
           top_logprobs=({5: -0.1, 9: -2.0}, {6: -0.2, 9: -2.1}, {7: -0.3, 11: -0.35}, {8: -0.4, 1: -3.0}))


def test_identical_runs_pass():
    assert compare_tokens(subject=BASE, oracle=BASE).valid is True
    assert compare_logprobs_close(subject=BASE, oracle=BASE).valid is True


def test_perturbed_token_list_is_reported():
    bad = Run(tokens=(5, 6, 99, 8))
    v = compare_tokens(subject=bad, oracle=BASE, subject_name="retire", oracle_name="clean_run")
    assert v.valid is False and "retire" in v.detail and "clean_run" in v.detail and "token 2" in v.detail
    with pytest.raises(AssertionError, match="subject and oracle differ at token 2"):
        assert_same_tokens(subject=bad, oracle=BASE)
    assert compare_tokens(subject=Run(tokens=(5, 6, 7)), oracle=BASE).valid is False  # truncated


def test_perturbed_logprobs_are_reported():
    bad = Run(tokens=BASE.tokens, logprobs=(-0.1, -1.2, -0.3, -0.4), top_logprobs=BASE.top_logprobs)
    v = compare_logprobs_close(subject=bad, oracle=BASE)
    assert v.valid is False and "atol" in v.detail
    with pytest.raises(AssertionError, match=r"token 1 \(6\): subject logprob -1.2000 vs oracle -0.2000"):
        assert_logprobs_close(subject=bad, oracle=BASE)


@pytest.mark.parametrize("side", ["subject", "oracle"])
def test_nan_logprob_is_reported(side):
    nan = Run(tokens=BASE.tokens, logprobs=(-0.1, float("nan"), -0.3, -0.4), top_logprobs=BASE.top_logprobs)
    a, b = (nan, BASE) if side == "subject" else (BASE, nan)
    v = compare_logprobs_close(subject=a, oracle=b)
    assert v.valid is False and "token 1" in v.detail


def test_near_tie_divergence_is_tolerated_and_far_divergence_is_not():
    tie = Run(tokens=(5, 6, 11, 3), logprobs=(-0.1, -0.2, -0.3, -9.0),
              top_logprobs=({5: -0.1}, {6: -0.2}, {11: -0.3, 7: -0.31}, {3: -9.0}))
    assert compare_logprobs_close(subject=tie, oracle=BASE).valid is True
    far = Run(tokens=(5, 6, 12, 3), logprobs=(-0.1, -0.2, -0.3, -9.0),
              top_logprobs=({5: -0.1}, {6: -0.2}, {12: -0.3, 13: -0.5}, {3: -9.0}))
    assert compare_logprobs_close(subject=far, oracle=BASE).valid is False


def test_crashing_comparison_is_unknown_not_pass():
    """Each comparator's crash path: an exception INSIDE the comparison becomes unknown (valid None, falsy), never a
    pass. (Missing logprobs are a separate, explicit unknown, not a crash.)"""
    short = Run(tokens=BASE.tokens, logprobs=(-0.1,), top_logprobs=BASE.top_logprobs)  # logprobs[1] raises IndexError
    v = compare_logprobs_close(subject=short, oracle=BASE)
    assert v.valid is None and not v and v.detail.startswith("comparator crashed: IndexError"), v.detail
    v = compare_tokens(subject=object(), oracle=BASE)  # iterating an object raises TypeError
    assert v.valid is None and not v and v.detail.startswith("comparator crashed: TypeError"), v.detail
    with pytest.raises(AssertionError, match="comparator crashed"):
        assert_same_tokens(subject=object(), oracle=BASE)  # the assert form does not pass an unknown either


def test_missing_logprobs_are_unknown_not_pass():
    v = compare_logprobs_close(subject=Run(tokens=(1,)), oracle=BASE)
    assert v.valid is None and not v and "logprobs missing" in v.detail
