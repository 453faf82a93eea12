"""The paired rounds' prompt seeds (perf/common.py, conformance/fixtures/prompts.py), engine-free and fast: they run in
the default suite.

Invariant: a warm-up round's prompts are valid (non-negative seeds) for any number of instance pairs and never equal a
measured round's; a FENCE round's seed is the same in every process (no salted `hash`)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conformance.fixtures.prompts import name_seed
from perf.common import ROUND_SEED, round_seeds, warmup_index

WIDEST = 8  # prompts per round of the widest no-revision workload (mixed-8)


def _seeds(i: int) -> list[int]:
    return round_seeds(i, WIDEST)


def _warmups_valid(index, pairs: int = 1000) -> bool:
    """Every warm-up seed of `pairs` instance pairs non-negative and below every measured round's."""
    warm = [s for k in range(pairs) for s in _seeds(index(k))]
    return min(warm) >= 0 and max(warm) < ROUND_SEED == min(_seeds(0))


@pytest.mark.timeout(60)
def test_warmup_seeds_stay_valid_and_apart_from_measured_ones():
    assert _warmups_valid(warmup_index)
    assert [warmup_index(k) for k in range(41)] == [-1 - k for k in range(41)]  # unchanged where it worked


@pytest.mark.timeout(60)
def test_negative_control_the_old_warmup_index_is_caught():
    assert _warmups_valid(lambda k: -1 - k, pairs=41)
    assert not _warmups_valid(lambda k: -1 - k, pairs=42)  # the 42nd pair's seed is negative


@pytest.mark.timeout(60)
def test_name_seed_is_the_same_in_another_process():
    code = "from conformance.fixtures.prompts import name_seed; print(name_seed('long-16k-16384-3'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True)
    assert int(other.stdout) == name_seed("long-16k-16384-3")
    assert name_seed("mixed-decode-0") != name_seed("mixed-decode-1")
