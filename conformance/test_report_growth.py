"""`retire report` on cost-growth benchmarks (perf/test_bench_growth.py `growth_curves`): one table with the
complexity statement and the fitted exponents per curve, one log-log PNG per curve, as recorded.

Negative controls: a curve with no positive median draws no figure and says why; a file without growth curves has no
cost-growth section and no growth PNG.
"""
from __future__ import annotations

from conformance.test_report import assert_png, bench_doc, run


def _curve(name="transition_vs_certified_blocks", ys=(1e-4, 3e-4, 1e-3, 4e-3)):
    xs = (1, 16, 256, 4096)
    return {"name": name, "x_label": "certified blocks", "y_label": "time (s)",
            "series": {"caller": [{"x": x, "y": {"n": 3, "median": y, "min": y * 0.9, "max": y * 1.2}}
                                  for x, y in zip(xs, ys)]},
            "fit": {"caller": {"exponent": 0.98, "r2": 0.99, "points": 3}},
            "complexity": "O(certified blocks): exponent 0.98"}


def test_growth_table_and_figure(tmp_path, capsys):
    rc, md = run(tmp_path, bench_doc({"scenario": "engine-free", "growth_curves": [_curve()]}), capsys)
    assert rc == 0
    assert "## Cost-growth curves" in md and "Complexity: O(certified blocks): exponent 0.98" in md
    assert "caller: exponent 0.98 (r² 0.99, 3 points)" in md
    assert "| 4096 | 0.004 [0.0036, 0.0048] |" in md
    assert "`growth_transition_vs_certified_blocks.png`: 1 series over 4 points" in md
    assert_png(tmp_path / "out" / "growth_transition_vs_certified_blocks.png")


def test_negative_control_no_positive_median_draws_no_figure(tmp_path, capsys):
    rc, md = run(tmp_path, bench_doc({"growth_curves": [_curve("flat", ys=(0, 0, 0, 0))]}), capsys)
    assert rc == 0
    assert "`growth_flat.png` skipped: no positive median" in md
    assert not (tmp_path / "out" / "growth_flat.png").exists()


def test_negative_control_no_growth_curves(tmp_path, capsys):
    rc, md = run(tmp_path, bench_doc({"scenario": "x", "fence_latency_s[retire]": 0.1}), capsys)
    assert rc == 0
    assert "Cost-growth" not in md and not list((tmp_path / "out").glob("growth_*.png"))
