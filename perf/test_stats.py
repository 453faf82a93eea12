"""The suite's own statistics (perf/common.py), engine-free and fast: they run in the default suite.

Invariant: the nested (instances, then pairs) bootstrap interval is never narrower than it should be when instances
differ systematically: with a between-instance offset it must widen beyond the flat bootstrap's interval, which only
sees trial noise (the negative control: the flat interval misses the instance effect)."""
from __future__ import annotations

import numpy as np

from perf.common import bootstrap_ci, bootstrap_ci_nested


def _instances(offsets, per=8, noise=0.005, seed=1):
    rng = np.random.default_rng(seed)
    return [list(1.0 + off + rng.normal(0, noise, per)) for off in offsets]


def test_nested_interval_widens_with_instance_offsets():
    groups = _instances([-0.012, 0.0, 0.012, 0.006])
    flat = bootstrap_ci([x for g in groups for x in g])
    nested = bootstrap_ci_nested(groups)
    assert flat and nested
    assert (nested[1] - nested[0]) > 1.5 * (flat[1] - flat[0]), (flat, nested)
    assert nested[0] < 1.0 < nested[1]


def test_nested_interval_matches_flat_without_instance_effect():
    groups = _instances([0.0, 0.0, 0.0, 0.0], per=12)
    flat = bootstrap_ci([x for g in groups for x in g])
    nested = bootstrap_ci_nested(groups)
    assert abs((nested[1] - nested[0]) - (flat[1] - flat[0])) < 0.5 * (flat[1] - flat[0]), (flat, nested)


def test_nested_needs_two_instances_and_is_deterministic():
    assert bootstrap_ci_nested([[1.0, 1.1]]) is None
    assert bootstrap_ci_nested([[1.0], [], [None]]) is None
    g = _instances([0.0, 0.01])
    assert bootstrap_ci_nested(g, seed=3) == bootstrap_ci_nested(g, seed=3)
