"""`retire report --compare OLD NEW`: per-metric NEW/OLD ratios between two pytest-benchmark runs.

Checker: the comparison must report a metric that moved (negative control: a planted 25% regression of one
metric is flagged "changed" with its exact ratio, while an unchanged metric is not), list metrics recorded by one run
only, and refuse inputs that are not benchmark runs (exit 2)."""
import json

import pytest

from retire.report import main
from retire.report.compare import compare, metrics


def _run(**extra):
    return {"machine_info": {}, "benchmarks": [{"name": "test_bench_x[1K]", "fullname": "perf/t.py::test_bench_x[1K]",
                                                 "stats": {"median": 2.0}, "extra_info": extra}]}


OLD = _run(**{"successor_ttft_s[retire]": {"n": 3, "median": 0.5, "min": 0.4, "max": 0.6}, "goodput": 100.0,
              "note": "text is not a metric", "gone": 1.0})
NEW = _run(**{"successor_ttft_s[retire]": {"n": 3, "median": 0.625, "min": 0.5, "max": 0.7}, "goodput": 100.0,
              "note": "text is not a metric", "added": 3.0})


def test_ratios_are_new_over_old_of_recorded_medians():
    res = compare(OLD, NEW, threshold=0.10)
    by = {r["metric"]: r for r in res["rows"]}
    assert by["successor_ttft_s[retire]"]["new/old"] == pytest.approx(1.25) and by["successor_ttft_s[retire]"]["changed"]
    assert by["goodput"]["new/old"] == 1.0 and not by["goodput"]["changed"]
    assert by["time_s (pytest-benchmark median)"]["new/old"] == 1.0
    assert "note" not in by and res["changed"] == 1
    assert res["only_old"] == [("perf/t.py::test_bench_x[1K]", "gone")]
    assert res["only_new"] == [("perf/t.py::test_bench_x[1K]", "added")]


def test_identical_runs_flag_nothing():
    res = compare(OLD, OLD)
    assert res["changed"] == 0 and all(r["new/old"] == 1.0 for r in res["rows"]) and len(res["rows"]) == 4


def test_zero_and_sign_change_are_flagged():
    a, b = _run(m=0.0, z=0.0, s=1.0), _run(m=2.0, z=0.0, s=-1.0)
    by = {r["metric"]: r for r in compare(a, b)["rows"]}
    assert by["m"]["new/old"] is None and by["m"]["changed"]
    assert by["z"]["new/old"] == 1.0 and not by["z"]["changed"]
    assert by["s"]["changed"]


def test_metrics_reads_only_numbers_and_summaries():
    m = metrics(_run(a=1, b=True, c=[1, 2], d={"median": 4}, e={"n": 1}, f=float("nan")))
    assert {k[1]: v for k, v in m.items()} == {"time_s (pytest-benchmark median)": 2.0, "a": 1.0, "d": 4.0}


def test_cli_prints_the_table_and_refuses_other_inputs(tmp_path, capsys):
    o, n, demo = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "demo.json"
    o.write_text(json.dumps(OLD))
    n.write_text(json.dumps(NEW))
    demo.write_text(json.dumps({"demo": "x", "sections": []}))
    assert main(["--compare", str(o), str(n)]) == 0
    out = capsys.readouterr().out
    assert "1.25" in out and "changed" in out and "only in OLD (1)" in out and "only in NEW (1)" in out
    assert main(["--compare", str(o), str(demo)]) == 2
    assert "is a demo file" in capsys.readouterr().err
    assert main([]) == 2
