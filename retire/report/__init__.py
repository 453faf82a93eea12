"""`retire report RESULTS.json [--out DIR]`: markdown tables (pandas) and PNG figures (matplotlib, Agg) from a results file.

Invariant: every number in the report and every point in a figure is read from the input file; nothing is recomputed,
resampled or invented (no ratio of medians, no interpolation). Missing data gives a line saying what was skipped and
why, never a crash and never a placeholder figure. A rounded value is printed with up to 6 significant digits.

Inputs, detected by shape (anything else, or an unreadable file, exits 2):
- pytest-benchmark JSON (`pytest perf -m bench --benchmark-json=...`): the figures are in each benchmark's `extra_info`
  (perf/test_bench_*.py). Summaries are dicts {"n", "median", "min", "max"} (+ "total"/"per_trial" for counts,
  "bootstrap_ci95_of_median", "overhead_pct_median" for the no-revision ratio). Keys `metric[arm]` are per-arm values;
  keys `metric[a/b]` are per-pair ratios. Families, by the first key that matches:
    FENCE vs prefill unit  "prefill_unit_tokens" + "fence_latency_{native,retire}_s" (+ "fence_speedup_native_over_retire",
                           "interruption_to_successor_{native,retire}_s", "interruption_to_successor_speedup")
    churn (Figure 5)       "churn_fraction" (churn volume / prefix-cache capacity) + "retained_tokens_<arm>", one point per
                           benchmark; or "churn_curve": [{"churn": x, "<arm>": y, ...}]. Arms: "native" (native-prefix),
                           "retire_hbm", "retire_dram"; y = retained prefix tokens, a number or a summary dict.
    timeline (Figure 6)    "timeline": {arm: [{"t": s, "current": n, "obsolete": n}, ...]}, or "timeline[arm]": [...],
                           or "timeline": [...] (arm = benchmark name): live current vs obsolete executions over time.
    FENCE at step boundary "fence_latency_s[arm]";  successor TTFT "successor_ttft_s[arm]";
    no-revision cost       "no_revision_cost_ratio[a/b]";  obsolete tokens "obsolete_tokens_published[arm]".
  Any other benchmark gets a generic key | value table of its scalar and summary extra_info entries.
- the demo JSON (results/demo.json, retire/demo.py): the side-by-side policy table per section.
- the conformance verdict JSON (`retire conform --json`, kind "retire-conformance"): guarantee | verdict | counts.
Figures (into DIR): fence_vs_unit.png, churn.png, replay_timeline.png.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import pandas as pd

KEYED = re.compile(r"^(?P<metric>[^\[\]]+)\[(?P<key>[^\[\]]+)\]$")
META = ("paper_metric", "scenario", "model", "note", "rounds_run", "rounds_admitted", "trials_rejected", "verdicts",
        "trials_per_arm", "calibrated_step_s")
HIDDEN = ("rejections", "arm_order", "landing_fractions")
FAMILIES = (("fence_latency_s[", "FENCE latency at the step boundary"), ("successor_ttft_s[", "Successor TTFT"),
            ("no_revision_cost_ratio[", "No-revision cost"),
            ("obsolete_tokens_published[", "Obsolete tokens: native vs retire"))
CHURN_LABELS = {"native": "native-prefix", "retire_hbm": "retire (HBM)", "retire_dram": "retire (DRAM)"}


class InputError(Exception):
    pass


# ------------------------------------------------------------------------------------------------ formatting
def num(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


def is_summary(v) -> bool:
    return isinstance(v, dict) and "median" in v


def med(v):
    """The recorded median of a summary, or the value itself if it is a number (else None)."""
    v = v.get("median") if is_summary(v) else v
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def cell(v) -> str:
    """'median [min, max]' for a summary, 'total (per trial median [min, max])' for a count, else the value."""
    if is_summary(v):
        s = num(v["median"]) if v.get("min") is None else f"{num(v['median'])} [{num(v['min'])}, {num(v['max'])}]"
        return f"{num(v['total'])} (per trial {s})" if "total" in v else s
    if isinstance(v, list):
        return ", ".join(map(cell, v)) if len(v) <= 8 else f"{len(v)} values"
    if isinstance(v, dict):
        return "; ".join(f"{k}: {cell(x)}" for k, x in v.items()) or "–"
    return num(v)


def md(df: pd.DataFrame) -> str:
    df = df.fillna("–").astype(str).map(lambda s: s.replace("|", "\\|"))
    rows = [list(df.columns), ["---"] * len(df.columns), *df.values.tolist()]
    return "\n".join("| " + " | ".join(map(str, r)) + " |" for r in rows)


# ------------------------------------------------------------------------------------------------ input
def load(path: Path) -> tuple[str, dict]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"cannot read {path}: {e}") from e
    if isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list) and all(
            isinstance(b, dict) and "name" in b for b in doc["benchmarks"]):
        return "bench", doc
    if isinstance(doc, dict) and (doc.get("kind") == "retire-conformance" or isinstance(doc.get("verdicts"), dict)):
        return "conform", doc
    if isinstance(doc, dict) and isinstance(doc.get("sections"), list) and "demo" in doc:
        return "demo", doc
    raise InputError(f"{path}: unknown input; expected pytest-benchmark JSON (top-level 'benchmarks'), the demo JSON "
                     "('demo' + 'sections') or `retire conform` verdicts (kind 'retire-conformance')")


def header(kind: str, doc: dict) -> str:
    mi = doc.get("machine_info") or doc.get("machine") or {}
    vs = {**mi, **(mi.get("versions") or {}), **(doc.get("versions") or {})}
    cpu = mi.get("cpu") if isinstance(mi.get("cpu"), dict) else {}
    parts = [p for p in (mi.get("node"), mi.get("platform") or " ".join(
        str(mi[k]) for k in ("system", "release", "machine") if mi.get(k)), cpu.get("brand_raw"),
        (f"{cpu.get('count') or mi.get('cpus') or mi.get('nproc')} CPUs"
         if cpu.get("count") or mi.get("cpus") or mi.get("nproc") else None),
        f"{mi['mem_total_gb']} GB" if mi.get("mem_total_gb") else None) if p]
    parts += [f"{k} {vs[k]}" for k in ("python_version", "python", "vllm", "torch") if vs.get(k)]
    ci = doc.get("commit_info") or {}
    if ci.get("id"):
        parts.append(f"commit {ci['id'][:10]}{' (dirty)' if ci.get('dirty') else ''}")
    if doc.get("version") and kind == "bench":
        parts.append(f"pytest-benchmark {doc['version']}")
    if doc.get("datetime"):
        parts.append(str(doc["datetime"]))
    return "Machine: " + (", ".join(map(str, parts)) if parts else "not recorded")


# ------------------------------------------------------------------------------------------------ benchmark sections
def label(b: dict) -> str:
    params = b.get("params") or {}
    return f"`{b['name']}`" + (f" ({', '.join(f'{k}={v}' for k, v in params.items())})" if params else "")


def context(ei: dict) -> str:
    bits = [f"{k.replace('_', ' ')}: {cell(ei[k])}" for k in META if k in ei and ei[k] not in ({}, [], None)]
    return ("_" + "; ".join(bits) + "_") if bits else ""


def family(ei: dict) -> str:
    if "prefill_unit_tokens" in ei and any(k.startswith("fence_latency_") for k in ei):
        return "fence_unit"
    if "churn_curve" in ei or ("churn_fraction" in ei and any(k.startswith("retained_tokens_") for k in ei)):
        return "churn"
    if "timeline" in ei or any(k.startswith("timeline[") for k in ei):
        return "timeline"
    for prefix, title in FAMILIES:
        if any(k.startswith(prefix) for k in ei):
            return title
    return "other"


def arm_tables(ei: dict) -> list[str]:
    """Per-arm table (rows = arms, columns = `metric[arm]` entries) and per-pair ratio table (`metric[a/b]`)."""
    arms, ratios = {}, []
    for k, v in ei.items():
        m = KEYED.match(k)
        if not m or k in HIDDEN or m["metric"] == "verdicts":
            continue
        if "/" in m["key"]:
            num_, den = m["key"].split("/", 1)
            r = v if isinstance(v, dict) else {"median": v}
            ratios.append({"ratio": f"{m['metric']} ({num_} / {den})", "n": num(r.get("n")),
                           "median": num(r.get("median")), "[min, max]": f"[{num(r.get('min'))}, {num(r.get('max'))}]",
                           "95% CI of median": (f"[{num(r['bootstrap_ci95_of_median'][0])}, "
                                                f"{num(r['bootstrap_ci95_of_median'][1])}]"
                                                if r.get("bootstrap_ci95_of_median") else None),
                           "overhead % (median)": num(r["overhead_pct_median"]) if "overhead_pct_median" in r else None})
        else:
            arms.setdefault(m["key"], {"arm": m["key"]})[m["metric"] + (" (s)" if m["metric"].endswith("_s") else "")
                                                        ] = cell(v)
    out = [md(pd.DataFrame(list(arms.values())))] if arms else []
    if ratios:
        out.append(md(pd.DataFrame(ratios).dropna(axis=1, how="all")))
    return out


def generic_table(ei: dict) -> str:
    rows = [{"key": k, "value": cell(v)} for k, v in ei.items() if k not in META and k not in HIDDEN
            and (isinstance(v, (int, float, str, bool)) or is_summary(v))]
    return md(pd.DataFrame(rows)) if rows else "_no scalar or summary extra_info_"


def fence_unit_table(bs: list[dict]) -> str:
    rows = []
    for b in sorted(bs, key=lambda b: (str((b.get("params") or {}).get("device")), med(b["extra_info"].get(
            "prefill_unit_tokens")) or 0)):
        ei = b["extra_info"]
        rows.append({"device": (b.get("params") or {}).get("device"), "unit": num(ei["prefill_unit_tokens"]),
                     "native (s)": cell(ei.get("fence_latency_native_s")),
                     "retire (s)": cell(ei.get("fence_latency_retire_s")),
                     "ratio native/retire (median [min,max])": cell(ei.get("fence_speedup_native_over_retire")),
                     "to successor, native (s)": cell(ei.get("interruption_to_successor_native_s")),
                     "to successor, retire (s)": cell(ei.get("interruption_to_successor_retire_s")),
                     "to successor ratio": cell(ei.get("interruption_to_successor_speedup")),
                     "pairs": num(ei.get("rounds_admitted"))})
    return md(pd.DataFrame(rows).replace("–", None).dropna(axis=1, how="all"))


def churn_points(bs: list[dict]) -> list[dict]:
    """[{"churn": x, arm: value, ...}] from both churn key layouts, in file order."""
    pts = []
    for b in bs:
        ei = b["extra_info"]
        if isinstance(ei.get("churn_curve"), list):
            pts += [p for p in ei["churn_curve"] if isinstance(p, dict) and med(p.get("churn")) is not None]
        if med(ei.get("churn_fraction")) is not None:
            pts.append({"churn": ei["churn_fraction"], **{k[len("retained_tokens_"):]: v for k, v in ei.items()
                                                          if k.startswith("retained_tokens_")}})
    return sorted(pts, key=lambda p: med(p["churn"]))


def timelines(bs: list[dict]) -> dict[str, list[dict]]:
    out = {}
    for b in bs:
        ei = b["extra_info"]
        tl = ei.get("timeline")
        series = dict(tl) if isinstance(tl, dict) else ({b["name"]: tl} if isinstance(tl, list) else {})
        series.update({m["key"]: v for k, v in ei.items() if (m := KEYED.match(k)) and m["metric"] == "timeline"})
        for arm, ps in series.items():
            ok = [p for p in ps or [] if isinstance(p, dict) and all(med(p.get(f)) is not None
                                                                    for f in ("t", "current", "obsolete"))]
            if ok:
                out[f"{arm}" if len(bs) == 1 else f"{b['name']}: {arm}"] = sorted(ok, key=lambda p: p["t"])
    return out


# ------------------------------------------------------------------------------------------------ figures
def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _errbar(ax, xs, vs, **kw):
    ys = [med(v) for v in vs]
    lo = [y - v["min"] if is_summary(v) and v.get("min") is not None else 0 for y, v in zip(ys, vs)]
    hi = [v["max"] - y if is_summary(v) and v.get("max") is not None else 0 for y, v in zip(ys, vs)]
    ax.errorbar(xs, ys, yerr=[lo, hi], capsize=4, marker="o", **kw)


def fig_fence(bs: list[dict], out: Path) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    devices = sorted({str((b.get("params") or {}).get("device", "")) for b in bs})
    for dev in devices:
        sel = sorted((b["extra_info"] for b in bs if str((b.get("params") or {}).get("device", "")) == dev),
                     key=lambda ei: med(ei["prefill_unit_tokens"]))
        for arm, color in (("native", "tab:red"), ("retire", "tab:blue")):
            pts = [(med(ei["prefill_unit_tokens"]), ei[f"fence_latency_{arm}_s"]) for ei in sel
                   if med(ei.get(f"fence_latency_{arm}_s")) is not None]
            if pts:
                _errbar(ax, [p[0] for p in pts], [p[1] for p in pts], color=color,
                        label=("native (step boundary)" if arm == "native" else "retire (safe point)")
                        + (f" [{dev}]" if len(devices) > 1 else ""), ls="-" if dev == devices[0] else "--")
    ax.set(xscale="log", yscale="log", xlabel="prefill unit (tokens per step)", ylabel="FENCE latency, median (s)",
           title="FENCE latency vs prefill unit (bars: min..max)")
    units = sorted({med(b["extra_info"]["prefill_unit_tokens"]) for b in bs})
    ax.set_xticks(units, [num(u) for u in units])
    ax.minorticks_off() if len(units) > 1 else None
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout(), fig.savefig(out), plt.close(fig)
    return f"{len(units)} prefill units"


def fig_churn(pts: list[dict], out: Path) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    arms = [a for a in dict.fromkeys(k for p in pts for k in p) if a != "churn"]
    for arm in arms:
        sel = [(med(p["churn"]), p[arm]) for p in pts if med(p.get(arm)) is not None]
        _errbar(ax, [x for x, _ in sel], [v for _, v in sel], label=CHURN_LABELS.get(arm, arm))
    ax.set(xlabel="churn / prefix-cache capacity", ylabel="retained prefix tokens",
           title="Retained prefix under cache churn")
    ax.grid(True, alpha=0.3), ax.legend()
    fig.tight_layout(), fig.savefig(out), plt.close(fig)
    return f"{len(pts)} churn points, arms {', '.join(arms)}"


def fig_timeline(tls: dict[str, list[dict]], out: Path) -> str:
    plt = _plt()
    fig, axes = plt.subplots(len(tls), 1, figsize=(6.4, 1.2 + 1.9 * len(tls)), dpi=120, sharex=True, squeeze=False)
    for ax, (arm, ps) in zip(axes[:, 0], tls.items()):
        t = [p["t"] for p in ps]
        ax.step(t, [p["current"] for p in ps], where="post", color="tab:blue", label="current")
        ax.step(t, [p["obsolete"] for p in ps], where="post", color="tab:red", label="obsolete")
        ax.fill_between(t, [p["obsolete"] for p in ps], step="post", color="tab:red", alpha=0.25)
        ax.set(ylabel="live executions", title=arm), ax.grid(True, alpha=0.3), ax.legend(loc="upper right")
    axes[-1, 0].set_xlabel("time (s)")
    fig.suptitle("Replay: live current vs obsolete executions"), fig.tight_layout(), fig.savefig(out), plt.close(fig)
    return f"{len(tls)} arm(s)"


def figure(name: str, out: Path, data, draw, missing: str) -> str:
    if not data:
        return f"- `{name}` skipped: {missing}"
    try:
        return f"- `{name}`: {draw(data, out / name)}\n\n![{name}]({name})"
    except Exception as e:  # noqa: BLE001 (a malformed value must not abort the report)
        return f"- `{name}` skipped: could not be drawn from the input ({type(e).__name__}: {e})"


# ------------------------------------------------------------------------------------------------ reports
def report_bench(doc: dict, out: Path) -> list[str]:
    bs = [b for b in doc["benchmarks"] if isinstance(b.get("extra_info"), dict)]
    groups: dict[str, list[dict]] = {}
    for b in bs:
        groups.setdefault(family(b["extra_info"]), []).append(b)
    lines = []
    if "fence_unit" in groups:
        lines += ["## FENCE latency vs prefill unit", "", context(groups["fence_unit"][0]["extra_info"]), "",
                  fence_unit_table(groups["fence_unit"]), ""]
    for _, title in FAMILIES:
        for b in groups.get(title, []):
            lines += [f"## {title}: {label(b)}", "", context(b["extra_info"]), "", *arm_tables(b["extra_info"]), ""]
    pts = churn_points(groups.get("churn", []))
    if pts:
        df = pd.DataFrame([{k: cell(v) for k, v in p.items()} for p in pts])
        lines += ["## Retained prefix under churn", "", md(df.rename(columns=CHURN_LABELS)), ""]
    tls = timelines(groups.get("timeline", []))
    if tls:
        df = pd.DataFrame([{"arm": a, "samples": len(ps), "t span (s)": f"{num(ps[0]['t'])} .. {num(ps[-1]['t'])}",
                            "peak current": num(max(p["current"] for p in ps)),
                            "peak obsolete": num(max(p["obsolete"] for p in ps))} for a, ps in tls.items()])
        lines += ["## Replay timeline", "", md(df), ""]
    for b in groups.get("other", []):
        lines += [f"## Other benchmark: {label(b)}", "", context(b["extra_info"]), "", generic_table(b["extra_info"]), ""]
    if not bs:
        lines += ["_no benchmark with extra_info in this file_", ""]
    lines += ["## Figures", "",
              figure("fence_vs_unit.png", out, groups.get("fence_unit"), fig_fence,
                     "no benchmark has FENCE-vs-unit data (extra_info 'prefill_unit_tokens' + 'fence_latency_*_s')"),
              figure("churn.png", out, pts, fig_churn,
                     "no churn data (extra_info 'churn_curve', or 'churn_fraction' + 'retained_tokens_<arm>')"),
              figure("replay_timeline.png", out, tls, fig_timeline,
                     "no timeline data (extra_info 'timeline': [{'t', 'current', 'obsolete'}] per arm)")]
    return lines


def report_demo(doc: dict) -> list[str]:
    lines = [f"Demo: {doc.get('demo')}, {doc.get('repeats')} repeats per policy, slow consumer "
             f"{num(doc.get('slow_consumer_s_per_frame'))} s/frame. Obsolete tokens: sum over repeats (per repeat); "
             "TTFT, reused, FENCE, wall: recorded medians.", ""]
    for s in doc["sections"]:
        rows = [{"policy": r.get("policy"),
                 "obsolete tokens published": f"{num(r.get('obsolete_tokens_published'))} "
                                              f"({'+'.join(map(num, r.get('obsolete_per_trial') or []))})",
                 "successor TTFT (median, s)": _fix(r.get("successor_ttft_s_median"), 3),
                 "tokens reused": num(r.get("tokens_reused_median")),
                 "FENCE latency (median, s)": _fix(r.get("fence_latency_s_median"), 3),
                 "wall time (s)": _fix(r.get("wall_s_median"), 2), "oracle verdict": r.get("verdict")}
                for r in s.get("summary") or []]
        lines += [f"## {s.get('scenario', s.get('id'))}", "", md(pd.DataFrame(rows)) if rows else "_no summary_", ""]
    lines += [f"Failed successors: {num(doc.get('failed'))}; obsolete tokens published by retire: "
              f"{num(doc.get('retire_obsolete'))}; total demo wall time: {_fix(doc.get('total_wall_s'), 1)} s", ""]
    return lines


def _fix(x, nd: int) -> str:
    return f"{x:.{nd}f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "–"


def report_conform(doc: dict) -> list[str]:
    word = {True: "valid", False: "**INVALID**", None: "unknown (nothing ran)"}
    rows = [{"guarantee": g, "verdict": word.get(v.get("valid"), str(v.get("valid"))),
             "passed/failed/skipped": f"{num(v.get('passed'))}/{num(v.get('failed'))}/{num(v.get('skipped'))}",
             "module": v.get("module")} for g, v in doc["verdicts"].items() if isinstance(v, dict)]
    vals = [v.get("valid") for v in doc["verdicts"].values() if isinstance(v, dict)]
    lines = [f"pytest exit code: {num(doc.get('pytest_exit'))}; {vals.count(True)} valid, {vals.count(False)} invalid, "
             f"{vals.count(None)} unknown", "", "## Conformance verdicts", "",
             md(pd.DataFrame(rows)) if rows else "_no verdicts_", ""]
    fails = [f for v in doc["verdicts"].values() if isinstance(v, dict) for f in v.get("failures") or []]
    return lines + (["Failures:", "", *(f"- `{f}`" for f in fails), ""] if fails else [])


def render(path: Path, out: Path) -> str:
    kind, doc = load(path)
    title = {"bench": "Benchmark report", "demo": "Demo report", "conform": "Conformance report"}[kind]
    body = {"bench": lambda: report_bench(doc, out), "demo": lambda: report_demo(doc),
            "conform": lambda: report_conform(doc)}[kind]()
    if kind != "bench":
        body += ["## Figures", "", f"- no figures for a {kind} file (fence_vs_unit.png, churn.png and "
                 "replay_timeline.png come from benchmark extra_info)"]
    return "\n".join([f"# {title}: `{path.name}`", "", header(kind, doc), "", *body]).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="retire report", description="tables and figures from a results JSON")
    ap.add_argument("results", type=Path, help="pytest-benchmark JSON, results/demo.json, or `retire conform` JSON")
    ap.add_argument("--out", type=Path, default=None, help="output directory (default: the input's directory)")
    try:
        a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        return int(e.code or 0)
    out = a.out or a.results.resolve().parent
    try:
        out.mkdir(parents=True, exist_ok=True)
        text = render(a.results, out)
    except InputError as e:
        print(f"retire report: {e}", file=sys.stderr)
        return 2
    (out / "report.md").write_text(text)
    print(text, end="")
    print(f"[retire report] wrote {out / 'report.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
