"""`retire report` (retire/report/): tables and figures are read from the input file only. Fast, no engine.

The sample conformance/fixtures/bench_sample.json holds the four perf/test_bench_core.py benchmarks trimmed from a real
CPU run and four HAND-MADE FENCE-vs-unit entries (keys as perf/test_bench_fence.py writes them; see its "_note").
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from retire.report import main

SAMPLE = Path(__file__).parent / "fixtures" / "bench_sample.json"
DEMO = Path(__file__).resolve().parent.parent / "results" / "demo.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(tmp_path: Path, doc_or_path, capsys, *extra: str) -> tuple[int, str]:
    if isinstance(doc_or_path, Path):
        src = doc_or_path
    else:
        src = tmp_path / "in.json"
        src.write_text(doc_or_path if isinstance(doc_or_path, str) else json.dumps(doc_or_path))
    rc = main([str(src), "--out", str(tmp_path / "out"), *extra])
    out = capsys.readouterr().out
    return rc, out


def assert_png(path: Path, min_bytes: int = 10_000) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path.name} is not a PNG"
    assert len(data) > min_bytes, f"{path.name} is only {len(data)} bytes"
    w, h = struct.unpack(">II", data[16:24])  # IHDR
    assert w >= 600 and h >= 400, (w, h)


def bench_doc(*extra_infos: dict) -> dict:
    return {"machine_info": {"node": "t", "machine": "x86_64"}, "commit_info": {}, "version": "5.3.1",
            "benchmarks": [{"name": f"test_x[{i}]", "fullname": f"perf/x.py::test_x[{i}]", "params": {},
                            "stats": {"median": 1.0}, "extra_info": ei} for i, ei in enumerate(extra_infos)]}


def test_sample_tables_and_fence_figure(tmp_path, capsys):
    rc, out = run(tmp_path, SAMPLE, capsys)
    assert rc == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert md == out  # stdout and report.md carry the same report
    assert "Machine: vm, Linux 6.18.44-fc-v595 x86_64, AMD EPYC, 2 CPUs, Python 3.11.7, commit f3a945aa56" in md
    # FENCE vs prefill unit: one row per unit, sorted, medians with [min, max] and the recorded paired ratio
    assert ("| device | unit | native (s) | retire (s) | ratio native/retire (median [min, max]) |" in md)
    rows = [line for line in md.splitlines() if line.startswith("| cpu | ")]
    assert [r.split(" | ")[1] for r in rows] == ["2048", "4096", "8192", "16384"]
    assert "| cpu | 16384 | 14.2 [12.7, 15.3] | 0.142 [0.125, 0.161] | 100 [78.88, 122.4] |" in md
    # FENCE at the step boundary (real run): per-arm table and the per-pair ratio as recorded
    assert "| native-cold | 1.8914 [1.871, 1.9144] | 2048 [2048, 2048] | – |" in md
    assert "| fence_latency_ratio (native-cold / retire) | 5 | 0.9861 | [0.9776, 0.9928] |" in md
    # successor TTFT: three arms, two ratios against retire
    assert "| arm | successor_ttft (s) | tokens_reused | obsolete_tokens_published |" in md
    assert "| retire | 8.6194 [8.3133, 69.8518] | 4096 [4096, 4096] | 0 |" in md
    assert "| ttft_speedup (native-prefix / retire) | 4 | 0.9814 | [0.3538, 2.3218] |" in md
    # no-revision cost: median ratio with its bootstrap 95% CI
    assert "| ratio | pairs | median | [min, max] | 95% CI of median |" in md
    assert ("| no_revision_cost_ratio (retire / native-prefix) | 12 | 0.9872 | [0.6256, 1.8902] | [0.9114, 1.0598] |"
            in md)
    # obsolete tokens: native publishes, retire does not
    assert "| native-cold | 76 (per trial 4 [1, 8]) | – |" in md
    assert "| retire | 0 (per trial 0 [0, 0]) | 75 |" in md
    # bookkeeping keys stay out of the tables
    assert "arm_order" not in md and "landing_fractions" not in md
    assert_png(tmp_path / "out" / "fence_vs_unit.png")
    assert "![fence_vs_unit.png](fence_vs_unit.png)" in md
    assert "`churn.png` skipped: no churn data" in md
    assert "`replay_timeline.png` skipped: no timeline data" in md
    assert not (tmp_path / "out" / "churn.png").exists() and not (tmp_path / "out" / "replay_timeline.png").exists()


def test_family_priority_ttft_with_fence_keys(tmp_path, capsys):
    """The TTFT benchmark also records fence_latency_s[arm] and fence_path[retire] (a count dict): it stays a TTFT
    section, and every arm-keyed entry lands in its table."""
    doc = json.loads(SAMPLE.read_text())
    ttft = next(b for b in doc["benchmarks"] if b["name"].startswith("test_bench_successor_ttft"))
    ttft["extra_info"]["fence_latency_s[retire]"] = {"n": 4, "median": 1.95, "min": 1.9, "max": 2.0}
    ttft["extra_info"]["fence_path[retire]"] = {"safe-point": 3, "step-boundary": 1}
    rc, md = run(tmp_path, doc, capsys)
    assert rc == 0
    assert md.count("## FENCE latency at the step boundary") == 1
    assert "## Successor TTFT: `test_bench_successor_ttft_demo_scenario[cpu]`" in md
    assert ("| retire | 8.6194 [8.3133, 69.8518] | 4096 [4096, 4096] | 0 | 1.95 [1.9, 2] "
            "| safe-point: 3; step-boundary: 1 |") in md
    assert md.index("## FENCE latency at the step boundary") < md.index("## Successor TTFT")


def _s(median, lo, hi, n=3):
    return {"n": n, "median": median, "min": lo, "max": hi}


def test_interruption_rows_stay_out_of_the_fence_table(tmp_path, capsys):
    """perf/test_bench_interruption.py records prefill_unit_tokens and fence_latency_s[arm] too: its benchmarks get
    their own table (unit x LCP case), and the FENCE-vs-unit table keeps one row per FENCE benchmark."""
    fence = {"prefill_unit_tokens": 2048, "fence_latency_native_s": _s(0.37, 0.27, 0.64),
             "fence_latency_retire_s": _s(0.08, 0.05, 0.11), "fence_speedup_native_over_retire": _s(4.68, 3.46, 8.72)}
    inter = lambda case, unit, r: {
        "paper_metric": "interruption-to-successor by LCP position", "prefill_unit_tokens": unit, "case": case,
        "lcp": unit // 2, "running_step": [unit, 2 * unit], "retire_paths": {"safe-point": 3},
        "fence_latency_s[retire]": _s(0.17, 0.15, 0.23),
        **{f"interruption_to_successor_s[{a}]": _s(v, v, v) for a, v in (("native-cold", 0.65),
                                                                          ("native-prefix", 0.35), ("retire", 0.31))},
        "speedup[native-prefix/retire]": _s(r, r, r), "speedup[native-cold/retire]": _s(2.05, 1.78, 5.82)}
    doc = bench_doc(fence, inter("after", 4096, 1.0), inter("before", 2048, 1.12), inter("inside", 2048, 1.01))
    rc, md = run(tmp_path, doc, capsys)
    assert rc == 0
    table = md.split("## FENCE latency vs prefill unit")[1].split("## ")[0]
    data = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith(("| unit", "| ---"))]
    assert data == ["| 2048 | 0.37 [0.27, 0.64] | 0.08 [0.05, 0.11] | 4.68 [3.46, 8.72] |"], table
    assert "## Interruption -> successor by LCP position" in md
    section = md.split("## Interruption -> successor by LCP position")[1].split("## ")[0]
    rows = [line for line in section.splitlines() if line.startswith(("| 2048 | ", "| 4096 | "))]
    assert [r.split(" | ")[1] for r in rows] == ["before", "inside", "after"]  # sorted by unit, then case
    assert rows[0].startswith("| 2048 | before | 1024 | [2048, 4096) | 0.65 [0.65, 0.65] | 0.35 [0.35, 0.35] "
                              "| 0.31 [0.31, 0.31] | 1.12 [1.12, 1.12] | 2.05 [1.78, 5.82] | safe-point: 3 |"), rows[0]


def test_churn_speedup_table(tmp_path, capsys):
    """Recovery and full-interval speed-ups per churn level, as recorded; a level without them is left out."""
    pts = [{"churn_fraction": 1.0, "retained_tokens_native": 0, "retained_tokens_retire_hbm": 4096,
            "recovery_speedup[native/retire_hbm]": _s(33.4, 33.0, 33.9, 2),
            "recovery_speedup[native/retire_dram]": _s(24.8, 24.3, 25.4, 2),
            "full_interval_speedup[native/retire_hbm]": _s(1.61, 1.56, 1.67, 2)},
           {"churn_fraction": 0.5, "retained_tokens_native": 4096, "retained_tokens_retire_hbm": 4096}]
    rc, md = run(tmp_path, bench_doc(*pts), capsys)
    assert rc == 0
    sec = md.split("## Recovery under churn (speed-up over native-prefix, paired)")[1].split("## ")[0]
    assert "| 1 | 33.4 [33, 33.9] | 24.8 [24.3, 25.4] | 1.61 [1.56, 1.67] |" in sec, sec
    assert "| 0.5 |" not in sec


def test_no_revision_vs_stock_is_a_cost_section(tmp_path, capsys):
    ei = {"paper_metric": "no-revision cost: retire policy vs stock vLLM (Table 11)",
          "latency_s[retire]": _s(1.50, 1.42, 1.59, 12), "latency_s[stock]": _s(1.49, 1.37, 1.53, 12),
          "cost_ratio[retire/stock]": {**_s(1.0178, 0.9654, 1.1257, 12), "overhead_pct_median": 1.78,
                                       "bootstrap_ci95_of_median": [1.0007, 1.0446]}}
    rc, md = run(tmp_path, bench_doc(ei), capsys)
    assert rc == 0 and "## No-revision cost: `test_x[0]`" in md
    assert "| cost_ratio (retire / stock) | 12 | 1.0178 | [0.9654, 1.1257] | [1.0007, 1.0446] | 1.78 |" in md


def test_default_out_is_input_directory(tmp_path, capsys):
    src = tmp_path / "bench.json"
    src.write_text(SAMPLE.read_text())
    assert main([str(src)]) == 0
    capsys.readouterr()
    assert (tmp_path / "report.md").exists() and (tmp_path / "fence_vs_unit.png").exists()


def test_cli_dispatch(tmp_path, capsys):
    from retire.cli import main as cli
    assert cli(["report", str(SAMPLE), "--out", str(tmp_path)]) == 0
    assert "## FENCE latency vs prefill unit" in capsys.readouterr().out


def test_negative_control_no_fence_data(tmp_path, capsys):
    """A benchmark file without FENCE-vs-unit data: no fence_vs_unit.png, and the report says why."""
    doc = json.loads(SAMPLE.read_text())
    doc["benchmarks"] = [b for b in doc["benchmarks"] if "prefill_unit_tokens" not in b["extra_info"]]
    # a FENCE-vs-unit entry whose latencies are missing does not count as data either
    doc["benchmarks"].append({"name": "test_bench_fence_latency_by_prefill_unit[cpu-2048]", "params": {},
                              "extra_info": {"prefill_unit_tokens": 2048, "fence_latency_native_s": {"n": 0,
                                             "median": None, "min": None, "max": None}}})
    rc, md = run(tmp_path, doc, capsys)
    assert rc == 0
    assert not (tmp_path / "out" / "fence_vs_unit.png").exists()
    assert "`fence_vs_unit.png` skipped: no FENCE-vs-unit data" in md
    assert "| fence_latency_ratio (native-cold / retire) | 5 | 0.9861 |" in md  # the other sections still render


@pytest.mark.parametrize("layout", ["curve", "per-benchmark"])
def test_churn_figure(tmp_path, capsys, layout):
    curve = [{"churn": 0.5, "native": 8192, "retire_hbm": 8192, "retire_dram": 8192},
             {"churn": 1.0, "native": 2048, "retire_hbm": 6144, "retire_dram": 8192},
             {"churn": 2.0, "native": 0, "retire_hbm": {"n": 3, "median": 1024, "min": 512, "max": 2048},
              "retire_dram": 8192}]
    if layout == "curve":
        doc = bench_doc({"scenario": "churn sweep", "churn_curve": curve})
    else:
        doc = bench_doc(*({"churn_fraction": p["churn"], **{f"retained_tokens_{a}": v for a, v in p.items()
                                                            if a != "churn"}} for p in curve))
    rc, md = run(tmp_path, doc, capsys)
    assert rc == 0
    assert "| churn | native-prefix | retire (HBM) | retire (DRAM) |" in md
    assert "| 2 | 0 | 1024 [512, 2048] | 8192 |" in md
    assert "`churn.png`: 3 churn point(s)" in md
    assert_png(tmp_path / "out" / "churn.png")
    assert "`fence_vs_unit.png` skipped" in md


def test_timeline_figure(tmp_path, capsys):
    tl = {"native-prefix": [{"t": 0, "current": 1, "obsolete": 0}, {"t": 1.5, "current": 1, "obsolete": 3},
                            {"t": 4, "current": 1, "obsolete": 0}],
          "retire": [{"t": 0, "current": 1, "obsolete": 0}, {"t": 1.5, "current": 1, "obsolete": 1},
                     {"t": 1.6, "current": 1, "obsolete": 0}, {"t": "bad", "current": 1, "obsolete": 0}]}
    rc, md = run(tmp_path, bench_doc({"timeline": tl}), capsys)
    assert rc == 0
    assert "| native-prefix | 3 | 0 .. 4 | 1 | 3 |" in md
    assert "| retire | 3 | 0 .. 1.6 | 1 | 1 |" in md  # the malformed point is dropped, not plotted
    assert_png(tmp_path / "out" / "replay_timeline.png")


def test_unknown_benchmark_gets_generic_table(tmp_path, capsys):
    rc, md = run(tmp_path, bench_doc({"scenario": "mystery", "widget_s": {"n": 3, "median": 0.5, "min": 0.4,
                                                                          "max": 0.7}, "count": 7, "blob": [1] * 20}),
                 capsys)
    assert rc == 0
    assert "## Other benchmark: `test_x[0]`" in md and "_scenario: mystery_" in md
    assert "| widget_s | 0.5 [0.4, 0.7] |" in md and "| count | 7 |" in md and "blob" not in md


def test_demo_shaped_input(tmp_path, capsys):
    row = lambda p, obs, reused: {"policy": p, "trials": 3, "obsolete_tokens_published": sum(obs),
                                  "obsolete_per_trial": obs, "successor_ttft_s_median": 0.0991234,
                                  "tokens_reused_median": reused, "fence_latency_s_median": 0.0041,
                                  "wall_s_median": 0.2512, "verdict": "3/3 pass (exact)"}
    doc = {"demo": "coding-agent revision", "repeats": 3, "slow_consumer_s_per_frame": 0.05,
           "sections": [{"id": "during-decode", "scenario": "B: revision during decode",
                         "summary": [row("native-cold", [4, 4, 4], 0), row("retire", [0, 0, 0], 896)]}],
           "versions": {"vllm": "0.32.0", "torch": "2.13.0+cpu", "python": "3.11.7"},
           "machine": {"nproc": 2, "platform": "Linux-x", "mem_total_gb": 23.5}, "failed": 0, "retire_obsolete": 0,
           "headline": [{"section": 3, "id": "during-decode", "ttft_ratio_native_prefix_over_retire": 1.0412,
                         "ttft_ratio_native_cold_over_retire": 4.2, "trials": 6, "oracle_pass": 6,
                         "obsolete_published": {"native-cold": 12, "native-prefix": None, "retire": 0},
                         "tokens_reused_median": {"native-cold": 0, "retire": 896},
                         "retire_fence_paths": {"step-boundary": 3}}]}
    rc, md = run(tmp_path, doc, capsys)
    assert rc == 0
    assert "## Summary: what retire bought per section" in md
    assert "| 3 during-decode | 1.04 | 4.20 | 12/–/0 | 0/–/896 | step-boundary 3 | 6/6 pass |" in md
    assert "Machine: Linux-x, 2 CPUs, 23.5 GB RAM, Python 3.11.7, vllm 0.32.0, torch 2.13.0+cpu" in md
    assert "## B: revision during decode" in md
    assert "| native-cold | 12 (4+4+4) | 0.099 | 0 | 0.004 | 0.25 | 3/3 pass (exact) |" in md
    assert "| retire | 0 (0+0+0) | 0.099 | 896 | 0.004 | 0.25 | 3/3 pass (exact) |" in md
    assert not list((tmp_path / "out").glob("*.png"))


# the demo outputs committed with the README's `make run` figures: a clean clone (CI) has no results/demo.json
COMMITTED_DEMOS = sorted(DEMO.parent.glob("demo-*.json"))


def test_committed_demo_outputs_exist():
    assert COMMITTED_DEMOS, "no results/demo-*.json committed: the real-demo rendering test would check nothing"


@pytest.mark.parametrize("src", COMMITTED_DEMOS, ids=lambda p: p.name)
def test_committed_demo_json(tmp_path, capsys, src):
    rc, md = run(tmp_path, src, capsys)
    assert rc == 0
    assert md.count("| policy | obsolete tokens published |") == len(json.loads(src.read_text())["sections"])


@pytest.mark.skipif(not DEMO.exists(), reason="results/demo.json not present (written by `make run`)")
def test_real_demo_json(tmp_path, capsys):
    rc, md = run(tmp_path, DEMO, capsys)
    assert rc == 0
    assert md.count("| policy | obsolete tokens published |") == len(json.loads(DEMO.read_text())["sections"])


def test_conform_shaped_input(tmp_path, capsys):
    from retire.conform import verdicts
    doc = {"kind": "retire-conformance", "version": 1, "pytest_exit": 1,
           "machine": {"python": "3.11.7", "platform": "Linux-x", "cpus": 2, "vllm": "0.32.0", "torch": None},
           "verdicts": verdicts({"test_publication": {"passed": 4, "failed": 0, "skipped": 2, "failures": []},
                                 "test_handoff": {"passed": 3, "failed": 1, "skipped": 0,
                                                  "failures": ["conformance/test_handoff.py::test_x[cpu]"]}})}
    rc, md = run(tmp_path, doc, capsys)
    assert rc == 0
    assert "Machine: Linux-x, 2 CPUs, Python 3.11.7, vllm 0.32.0" in md and "torch" not in md.splitlines()[2]
    assert "| guarantee | verdict | passed/failed/skipped | module |" in md
    assert "| current-version publication | valid | 4/0/2 | conformance/test_publication.py |" in md
    assert "| versioned handoff | **INVALID** | 3/1/0 | conformance/test_handoff.py |" in md
    assert "| retired-state isolation | unknown (nothing ran) | 0/0/0 |" in md
    assert "- `conformance/test_handoff.py::test_x[cpu]`" in md
    assert "1 invalid" in md


@pytest.mark.parametrize("content", ['{"hello": 1}', "[1, 2]", "not json {", '{"benchmarks": [1]}',
                                     '{"kind": "something-else", "verdicts": {}}'])
def test_unknown_or_unreadable_input_exits_2(tmp_path, capsys, content):
    src = tmp_path / "in.json"
    src.write_text(content)
    assert main([str(src), "--out", str(tmp_path / "out")]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.startswith("retire report: ")
    assert ("unknown input" in cap.err) or ("cannot read" in cap.err)
    assert not (tmp_path / "out").exists()


def test_missing_file_exits_2(tmp_path, capsys):
    assert main([str(tmp_path / "nope.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
