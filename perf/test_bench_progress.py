"""The bench progress record (`perf/conftest.py`), engine-free: a benchmark that times out inside its pedantic run
must not cost the other benchmarks their JSON, and every benchmark leaves one line in the progress log.
Negative control: the same run with the pruning removed writes no JSON (pytest-benchmark's writer raises)."""
from __future__ import annotations

import json
from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py").read_text()
TESTS = """
def test_ok(benchmark):
    benchmark.extra_info["x"] = 1
    benchmark.pedantic(lambda: sum(range(100)), rounds=2, iterations=1)

def test_times_out_inside(benchmark):
    import pytest
    def boom():
        pytest.fail("Timeout >900.0s")  # what pytest-timeout raises: a BaseException, not an Exception
    benchmark.pedantic(boom, rounds=1, iterations=1)
"""


def _run(pytester, monkeypatch, conftest: str):
    log, out = pytester.path / "progress.jsonl", pytester.path / "bench.json"
    monkeypatch.setenv("RETIRE_BENCH_LOG", str(log))
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_x=TESTS)
    res = pytester.runpytest_subprocess(f"--benchmark-json={out}", "-p", "no:cacheprovider", "-p", "no:randomly")
    return res, log, out


def test_a_benchmark_timing_out_inside_pedantic_leaves_the_json_and_the_log(pytester, monkeypatch):
    res, log, out = _run(pytester, monkeypatch, CONFTEST)
    res.assert_outcomes(passed=1, failed=1)
    assert [b["name"] for b in json.loads(out.read_text())["benchmarks"]] == ["test_ok"]
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(r["test"].split("::")[1], r["status"]) for r in lines] == [
        ("test_ok", "measured"), ("test_times_out_inside", "no round recorded")]
    assert lines[0]["extra_info"] == {"x": 1} and lines[0]["stats"]["rounds"] == 2


def test_negative_control_without_pruning_no_json_is_written(pytester, monkeypatch):
    pruning = "        bs.benchmarks[:] = [b for b in bs.benchmarks if _recorded(b)]"
    assert pruning in CONFTEST
    res, log, out = _run(pytester, monkeypatch, CONFTEST.replace(pruning, "        pass"))
    assert not out.exists(), "pytest-benchmark wrote its JSON despite an empty benchmark: the pruning is not needed"
    assert len(log.read_text().splitlines()) == 2  # the progress log still has both


def test_ctrl_c_inside_a_benchmark_keeps_the_finished_lines_and_raises_nothing_else(pytester, monkeypatch):
    """`make no-revision-ci` is stopped with Ctrl-C: the teardown after the interrupt must not raise (pytest clears
    the test's fixture values), and the benchmarks that finished keep their lines."""
    log = pytester.path / "progress.jsonl"
    monkeypatch.setenv("RETIRE_BENCH_LOG", str(log))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_x=TESTS.split("def test_times_out_inside")[0] + """
def test_interrupted(benchmark):
    def stop():
        raise KeyboardInterrupt
    benchmark.pedantic(stop, rounds=1, iterations=1)
""")
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    out = res.stdout.str() + res.stderr.str()
    assert "KeyboardInterrupt" in out and "AttributeError" not in out, out[-2000:]
    assert [json.loads(x)["test"].split("::")[1] for x in log.read_text().splitlines()] == ["test_ok"]
