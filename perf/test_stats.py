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


def test_growth_exponent_and_order_follow_the_data():
    """The fitted exponent recovers a planted power law and the complexity statement follows it; negative control:
    a quadratic curve is never stated as linear or flat."""
    from perf.common import loglog_fit, order

    xs = [1, 10, 100, 1000, 10000]
    lin = loglog_fit([(x, 3e-6 * x) for x in xs])
    flat = loglog_fit([(x, 2e-4) for x in xs])
    quad = loglog_fit([(x, 1e-9 * x * x) for x in xs])
    assert (lin["exponent"], flat["exponent"], quad["exponent"]) == (1.0, 0.0, 2.0)
    assert (order(lin["exponent"], "n"), order(flat["exponent"], "n")) == ("O(n)", "O(1)")
    assert order(quad["exponent"], "n") == "O(n^2.0)"
    assert loglog_fit([(1, 1.0), (2, 2.0)]) is None and order(None, "n") == "unfitted"
