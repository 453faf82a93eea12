"""`retire report RESULTS.json [--out DIR]` (and `retire report --compare OLD NEW`, retire/report/compare.py): markdown tables (pandas) and PNG figures (matplotlib, Agg backend) from
a results file.

Invariant: figures and tables are derived only from the input file; nothing is recomputed, resampled or invented (no
ratio of medians, no interpolation, no timing of our own). Every number is printed as recorded (up to 6 significant
digits). Missing data gives a line saying what was skipped and why, never a crash and never a placeholder figure.
The report goes to stdout and DIR/report.md (DIR defaults to the input's directory); figures go to DIR.

Inputs, detected by shape (anything else, or an unreadable file, exits 2 with a message on stderr):
- pytest-benchmark JSON (`pytest perf -m bench --benchmark-json=results/bench.json`). Only `extra_info` is read
  (perf/test_bench_*.py). Summaries are dicts {"n", "median", "min", "max"} (+ "total"/"per_trial" for counts,
  "bootstrap_ci95_of_median" and "overhead_pct_median" for the no-revision ratio). Keys `metric[arm]` are per-arm
  values, keys `metric[a/b]` per-pair ratios. A benchmark's family is the first of these whose keys it has:
    interruption by LCP     "case" (before / inside / after) + "interruption_to_successor_s[arm]" (+ "speedup[a/b]",
                            "prefill_unit_tokens", "lcp", "retire_paths")            -> one table, rows unit x case
    FENCE vs prefill unit   "prefill_unit_tokens" + "fence_latency_native_s" / "fence_latency_retire_s"
                            (+ "fence_speedup_native_over_retire", "interruption_to_successor_{native,retire}_s",
                            "interruption_to_successor_speedup")                      -> table + fence_vs_unit.png
    churn (Figure 5)        "churn_fraction" (churn volume / prefix-cache capacity) with "retained_tokens_<arm>", one
                            point per benchmark; or "churn_curve": [{"churn": x, "<arm>": y, ...}]. Arms: "native"
                            (native-prefix), "retire_hbm", "retire_dram" (others plotted under their own name); y =
                            retained prefix tokens, a number or a summary (min..max drawn as error bars);
                            "recovery_speedup[native/<tier>]", "full_interval_speedup[native/<tier>]"
                                                                  -> retained table, speed-up table + churn.png
    replay timeline (Fig. 6) "timeline": {arm: [{"t": s, "current": n, "obsolete": n}, ...]}, or "timeline[arm]":
                            [...], or "timeline": [...] (arm = the benchmark's name): live current and obsolete
                            executions over time                                       -> table + replay_timeline.png
                            With per-arm replay metrics (`metric[arm]`, perf/test_bench_replay.py) it also gets a
                            Table 9 style per-arm table, the per-pair ratios and the recorded "targets" verdicts.
    cost-growth curves      "growth_curves": [{"name", "x_label", "y_label", "series": {name: [{"x", "y"}]},
                            "fit": {name: {"exponent", "r2", "points"}}, "complexity"}] (perf/test_bench_growth.py)
                                                  -> per curve: statement, fits, table + growth_<name>.png
    revision-rate matrix    "replay_matrix": [{rate, concurrency, policy, quantum, ...}] (+ "best_native_quantum")
                            (paper A.2.2)                                              -> the rows as recorded
    FENCE at step boundary "fence_latency_s[arm]"; successor TTFT "successor_ttft_s[arm]"; no-revision cost
                            "no_revision_cost_ratio[a/b]", "cost_ratio[a/b]" or "cost_ratio_total[a/b]";
                            obsolete tokens "obsolete_tokens_published[arm]"
                                                                                      -> per-arm + per-pair ratio tables
  Any other benchmark gets a generic key | value table of its scalar and summary extra_info entries.
- the demo JSON (results/demo.json, written by retire/demo.py): its side-by-side policy table per section.
- `retire conform --json` verdicts (kind "retire-conformance"): guarantee | verdict | passed/failed/skipped.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from .fmt import fix, md, num

__all__ = ["main", "render", "load", "InputError"]


class InputError(Exception):
    """The input cannot be read or is none of the three known shapes (exit code 2)."""


def load(path: Path) -> tuple[str, dict]:
    """(kind, document) with kind in {"bench", "demo", "conform"}; raises InputError otherwise."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"cannot read {path}: {e}") from e
    if not isinstance(doc, dict):
        raise InputError(f"{path}: unknown input (top level is a {type(doc).__name__}, expected an object)")
    if isinstance(doc.get("benchmarks"), list) and all(isinstance(b, dict) and "name" in b for b in doc["benchmarks"]):
        return "bench", doc
    if isinstance(doc.get("verdicts"), dict) and doc.get("kind", "retire-conformance") == "retire-conformance":
        return "conform", doc
    if isinstance(doc.get("sections"), list) and "demo" in doc:
        return "demo", doc
    raise InputError(f"{path}: unknown input; expected pytest-benchmark JSON (top-level 'benchmarks'), the demo JSON "
                     "('demo' + 'sections') or `retire conform` verdicts (kind 'retire-conformance' + 'verdicts')")


def header(kind: str, doc: dict) -> str:
    """One line: machine, CPU, versions (python, vllm, torch when recorded), commit, tool version, date."""
    mi = doc.get("machine_info") if isinstance(doc.get("machine_info"), dict) else doc.get("machine")
    mi = mi if isinstance(mi, dict) else {}
    vs = {**mi, **(mi.get("versions") or {}), **(doc.get("versions") or {})}
    cpu = mi.get("cpu") if isinstance(mi.get("cpu"), dict) else {}
    ncpu = cpu.get("count") or mi.get("cpus") or mi.get("nproc")
    parts = [mi.get("node"), mi.get("platform") or " ".join(str(mi[k]) for k in ("system", "release", "machine")
                                                             if mi.get(k)),
             cpu.get("brand_raw"), f"{ncpu} CPUs" if ncpu else None,
             f"{num(mi['mem_total_gb'])} GB RAM" if mi.get("mem_total_gb") else None]
    parts += [f"{name} {vs[k]}" for k, name in (("python_version", "Python"), ("python", "Python"), ("vllm", "vllm"),
                                                ("torch", "torch"), ("transformers", "transformers")) if vs.get(k)]
    ci = doc.get("commit_info") if isinstance(doc.get("commit_info"), dict) else {}
    if ci.get("id"):
        parts.append(f"commit {str(ci['id'])[:10]}{' (dirty)' if ci.get('dirty') else ''}")
    if kind == "bench" and doc.get("version"):
        parts.append(f"pytest-benchmark {doc['version']}")
    if doc.get("datetime"):
        parts.append(str(doc["datetime"]))
    parts = list(dict.fromkeys(str(p) for p in parts if p))
    return "Machine: " + (", ".join(parts) if parts else "not recorded in the input")


def report_demo(doc: dict) -> list[str]:
    """The demo's side-by-side table (retire/demo.py `table`), plus the recorded FENCE latency median."""
    lines = [f"Demo: {doc.get('demo')}, {num(doc.get('repeats'))} repeats per policy, slow consumer "
             f"{num(doc.get('slow_consumer_s_per_frame'))} s/frame. Obsolete tokens: sum over repeats (per repeat); "
             "TTFT, tokens reused, FENCE, wall: recorded medians.", ""]
    for s in doc["sections"]:
        s = s if isinstance(s, dict) else {}
        rows = [{"policy": r.get("policy"),
                 "obsolete tokens published": f"{num(r.get('obsolete_tokens_published'))} "
                                              f"({'+'.join(map(num, r.get('obsolete_per_trial') or []))})",
                 "successor TTFT (median, s)": fix(r.get("successor_ttft_s_median"), 3),
                 "tokens reused": num(r.get("tokens_reused_median")),
                 "FENCE latency (median, s)": fix(r.get("fence_latency_s_median"), 3),
                 "wall time (s)": fix(r.get("wall_s_median"), 2), "oracle verdict": r.get("verdict")}
                for r in s.get("summary") or [] if isinstance(r, dict)]
        lines += [f"## {s.get('scenario', s.get('id'))}", "", md(pd.DataFrame(rows)) if rows else "_no summary_", ""]
    return lines + [f"Failed successors: {num(doc.get('failed'))}; obsolete tokens published by retire: "
                    f"{num(doc.get('retire_obsolete'))}; total demo wall time: {fix(doc.get('total_wall_s'), 1)} s", ""]


def report_conform(doc: dict) -> list[str]:
    """guarantee | verdict | passed/failed/skipped | module; `valid` null is 'unknown', never a pass."""
    word = {True: "valid", False: "**INVALID**", None: "unknown (nothing ran)"}
    vs = {g: v for g, v in doc["verdicts"].items() if isinstance(v, dict)}
    rows = [{"guarantee": g, "verdict": word.get(v.get("valid"), str(v.get("valid"))),
             "passed/failed/skipped": f"{num(v.get('passed'))}/{num(v.get('failed'))}/{num(v.get('skipped'))}",
             "module": v.get("module")} for g, v in vs.items()]
    valid = [v.get("valid") for v in vs.values()]
    lines = [f"pytest exit code: {num(doc.get('pytest_exit'))}; {len(vs)} guarantees: {valid.count(True)} valid, "
             f"{valid.count(False)} invalid, {valid.count(None)} unknown", "", "## Conformance verdicts", "",
             md(pd.DataFrame(rows)) if rows else "_no verdicts_", ""]
    fails = [f for v in vs.values() for f in v.get("failures") or []]
    return lines + (["Failures:", "", *(f"- `{f}`" for f in fails), ""] if fails else [])


def render(path: Path, out: Path) -> str:
    """The markdown report of `path`; figures are written into `out` (created if needed)."""
    kind, doc = load(path)
    out.mkdir(parents=True, exist_ok=True)
    if kind == "bench":
        from . import bench
        body = bench.report(doc, out)
    else:
        body = (report_demo(doc) if kind == "demo" else report_conform(doc)) + [
            "## Figures", "", f"- no figures for a {kind} file: fence_vs_unit.png, churn.png and replay_timeline.png "
            "come from benchmark extra_info"]
    title = {"bench": "Benchmark report", "demo": "Demo report", "conform": "Conformance report"}[kind]
    return "\n".join([f"# {title}: `{Path(path).name}`", "", header(kind, doc), "", *body]).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="retire report", description="markdown tables and PNG figures from a results "
                                 "JSON (pytest-benchmark, results/demo.json, or `retire conform --json`)")
    ap.add_argument("results", type=Path, nargs="?", help="the results JSON")
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("OLD", "NEW"), default=None,
                    help="print per-metric NEW/OLD ratios between two pytest-benchmark JSONs instead")
    ap.add_argument("--threshold", type=float, default=0.10, help="with --compare: flag ratios beyond 1 +- this")
    ap.add_argument("--out", type=Path, default=None, help="output directory (default: the input's directory)")
    try:
        a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # argparse: -h is 0, a usage error is 2
        return e.code if isinstance(e.code, int) else 2
    if a.compare is not None:
        return _compare(*a.compare, threshold=a.threshold)
    if a.results is None:
        print("retire report: give a results JSON, or --compare OLD NEW", file=sys.stderr)
        return 2
    out = a.out if a.out is not None else a.results.resolve().parent
    try:
        text = render(a.results, out)
        (out / "report.md").write_text(text)
    except (InputError, OSError) as e:
        print(f"retire report: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    print(f"[retire report] wrote {out / 'report.md'}", file=sys.stderr)
    return 0


def _compare(old: Path, new: Path, *, threshold: float) -> int:
    from . import compare
    try:
        docs = [load(p) for p in (old, new)]
    except InputError as e:
        print(f"retire report: {e}", file=sys.stderr)
        return 2
    for p, (kind, _) in zip((old, new), docs):
        if kind != "bench":
            print(f"retire report: --compare takes pytest-benchmark JSONs; {p} is a {kind} file", file=sys.stderr)
            return 2
    print(compare.render(old.name, new.name, compare.compare(docs[0][1], docs[1][1], threshold=threshold)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
