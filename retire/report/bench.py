"""Sections of a pytest-benchmark JSON: one per benchmark family (keys listed in `retire.report`'s docstring).

Only `extra_info` is read (pytest-benchmark's own `stats` time whole rounds and mean little here). Keys `metric[arm]`
are per-arm values, keys `metric[a/b]` per-pair ratios as recorded by perf/common.py; both are printed as recorded.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from . import figures
from .fmt import cell, is_summary, md, med, num

KEYED = re.compile(r"^(?P<metric>[^\[\]]+)\[(?P<key>[^\[\]]+)\]$")
META = ("paper_metric", "scenario", "model", "note", "rounds_run", "rounds_admitted", "trials_rejected", "verdicts",
        "trials_per_arm", "calibrated_step_s", "trace", "time_scale", "timeline_round")
HIDDEN = ("rejections", "arm_order", "landing_fractions")
# detection priority (the TTFT benchmark also records fence_latency_s[arm], so it must be recognised first)
FAMILIES = (("successor_ttft_s[", "Successor TTFT"), ("no_revision_cost_ratio[", "No-revision cost"),
            ("cost_ratio[", "No-revision cost"), ("cost_ratio_total[", "No-revision cost"),
            ("fence_latency_s[", "FENCE latency at the step boundary"),
            ("obsolete_tokens_published[", "Obsolete tokens: native vs retire"))
ORDER = ("FENCE latency at the step boundary", "Successor TTFT", "No-revision cost",
         "Obsolete tokens: native vs retire")


def family(ei: dict) -> str:
    if isinstance(ei.get("growth_curves"), list):
        return "growth"
    if "case" in ei and any(k.startswith("interruption_to_successor_s[") for k in ei):
        return "interruption"
    if "prefill_unit_tokens" in ei and any(k.startswith("fence_latency_") for k in ei):
        return "fence_unit"
    if "churn_curve" in ei or ("churn_fraction" in ei and any(k.startswith("retained_tokens_") for k in ei)):
        return "churn"
    if isinstance(ei.get("replay_matrix"), list):
        return "replay_matrix"
    if "timeline" in ei or any(k.startswith("timeline[") for k in ei):
        return "timeline"
    for prefix, title in FAMILIES:
        if any(k.startswith(prefix) for k in ei):
            return title
    return "other"


def label(b: dict) -> str:
    params = b.get("params") or {}
    return f"`{b['name']}`" + (f" ({', '.join(f'{k}={v}' for k, v in params.items())})" if params else "")


def context(ei: dict, keys=META) -> str:
    bits = [f"{k.replace('_', ' ')}: {cell(ei[k])}" for k in keys if k in ei and ei[k] not in ({}, [], None, "")]
    return ("_" + "; ".join(bits) + "_") if bits else ""


def _col(metric: str) -> str:
    return metric[:-2] + " (s)" if metric.endswith("_s") else metric


def arm_tables(ei: dict) -> list[str]:
    """Per-arm table (rows = arms, columns = `metric[arm]` entries) and per-pair ratio table (`metric[a/b]`)."""
    arms, ratios = {}, []
    for k, v in ei.items():
        m = KEYED.match(k)
        if not m or k in HIDDEN or m["metric"] == "verdicts":
            continue
        if "/" not in m["key"]:
            arms.setdefault(m["key"], {"arm": m["key"]})[_col(m["metric"])] = cell(v)
            continue
        a, b = m["key"].split("/", 1)
        r = v if isinstance(v, dict) else {"median": v}
        ci = r.get("bootstrap_ci95_of_median")
        ratios.append({"ratio": f"{m['metric']} ({a} / {b})", "pairs": num(r.get("n")), "median": num(r.get("median")),
                       "[min, max]": f"[{num(r.get('min'))}, {num(r.get('max'))}]" if "min" in r else None,
                       "95% CI of median": f"[{num(ci[0])}, {num(ci[1])}]" if isinstance(ci, list) and ci else None,
                       "overhead % (median)": num(r["overhead_pct_median"]) if "overhead_pct_median" in r else None})
    out = [md(pd.DataFrame(list(arms.values())))] if arms else []
    if ratios:
        out.append(md(pd.DataFrame(ratios).dropna(axis=1, how="all")))
    return out


def generic_table(ei: dict) -> str:
    rows = [{"key": k, "value": cell(v)} for k, v in ei.items() if k not in META and k not in HIDDEN
            and (isinstance(v, (int, float, str, bool)) or is_summary(v))]
    return md(pd.DataFrame(rows)) if rows else "_no scalar or summary extra_info_"


def fence_unit_table(bs: list[dict]) -> str:
    """unit | native (s) | retire (s) | ratio (median [min, max]) | interruption -> successor ... | pairs."""
    rows = []
    key = lambda b: (str((b.get("params") or {}).get("device")), med(b["extra_info"]["prefill_unit_tokens"]) or 0)
    for b in sorted(bs, key=key):
        ei = b["extra_info"]
        rows.append({"device": (b.get("params") or {}).get("device"), "unit": num(ei["prefill_unit_tokens"]),
                     "native (s)": cell(ei.get("fence_latency_native_s")),
                     "retire (s)": cell(ei.get("fence_latency_retire_s")),
                     "ratio native/retire (median [min, max])": cell(ei.get("fence_speedup_native_over_retire")),
                     "to successor, native (s)": cell(ei.get("interruption_to_successor_native_s")),
                     "to successor, retire (s)": cell(ei.get("interruption_to_successor_retire_s")),
                     "to successor, ratio": cell(ei.get("interruption_to_successor_speedup")),
                     "pairs": num(ei.get("rounds_admitted"))})
    return md(pd.DataFrame(rows).replace("–", None).dropna(axis=1, how="all"))


def interruption_table(bs: list[dict]) -> str:
    """unit | LCP case | interruption -> successor per arm (s) | paired speedups | retire's FENCE paths | pairs."""
    order = {"before": 0, "inside": 1, "after": 2}
    key = lambda b: (med(b["extra_info"].get("prefill_unit_tokens")) or 0, order.get(b["extra_info"].get("case"), 9))
    rows = []
    for b in sorted(bs, key=key):
        ei = b["extra_info"]
        row = {"unit": num(ei.get("prefill_unit_tokens")), "LCP ends": ei.get("case"), "LCP": num(ei.get("lcp")),
               "running step": (f"[{num(ei['running_step'][0])}, {num(ei['running_step'][1])})"
                                if isinstance(ei.get("running_step"), list) and len(ei["running_step"]) == 2 else None)}
        row.update({f"{a} (s)": cell(ei.get(f"interruption_to_successor_s[{a}]"))
                    for a in ("native-cold", "native-prefix", "retire")})
        row.update({f"{a} / retire": cell(ei.get(f"speedup[{a}/retire]")) for a in ("native-prefix", "native-cold")})
        row["retire paths"] = cell(ei.get("retire_paths"))
        row["pairs"] = num(ei.get("rounds_admitted"))
        rows.append(row)
    return md(pd.DataFrame(rows).replace("–", None).dropna(axis=1, how="all"))


CHURN_SPEEDUPS = ("recovery_speedup[native/retire_hbm]", "recovery_speedup[native/retire_dram]",
                  "full_interval_speedup[native/retire_hbm]", "full_interval_speedup[native/retire_dram]")


def churn_speedups(bs: list[dict]) -> str | None:
    """churn | recovery and full-interval speed-ups of each retire tier over native-prefix (paired, as recorded)."""
    rows = [{"churn": cell(b["extra_info"]["churn_fraction"]),
             **{k: cell(b["extra_info"][k]) for k in CHURN_SPEEDUPS if k in b["extra_info"]}}
            for b in sorted(bs, key=lambda b: med(b["extra_info"].get("churn_fraction")) or 0)
            if med(b["extra_info"].get("churn_fraction")) is not None
            and any(k in b["extra_info"] for k in CHURN_SPEEDUPS)]
    return md(pd.DataFrame(rows)) if rows else None


def churn_points(bs: list[dict]) -> list[dict]:
    """[{"churn": x, arm: value, ...}] from both churn key layouts, sorted by churn."""
    pts = []
    for b in bs:
        ei = b["extra_info"]
        if isinstance(ei.get("churn_curve"), list):
            pts += [p for p in ei["churn_curve"] if isinstance(p, dict) and med(p.get("churn")) is not None]
        if med(ei.get("churn_fraction")) is not None:
            pts.append({"churn": ei["churn_fraction"], **{k[len("retained_tokens_"):]: v for k, v in ei.items()
                                                          if k.startswith("retained_tokens_")}})
    pts = [{"churn": p["churn"], **{a: v for a, v in p.items() if a != "churn" and med(v) is not None}} for p in pts]
    return sorted([p for p in pts if len(p) > 1], key=lambda p: med(p["churn"]))


def timelines(bs: list[dict]) -> dict[str, list[dict]]:
    """arm -> points with numeric t/current/obsolete (others dropped), sorted by t."""
    out = {}
    for b in bs:
        ei = b["extra_info"]
        tl = ei.get("timeline")
        series = dict(tl) if isinstance(tl, dict) else ({b["name"]: tl} if isinstance(tl, list) else {})
        series.update({m["key"]: v for k, v in ei.items() if (m := KEYED.match(k)) and m["metric"] == "timeline"})
        for arm, ps in series.items():
            ok = [p for p in (ps if isinstance(ps, list) else []) if isinstance(p, dict)
                  and all(_number(p.get(f)) for f in ("t", "current", "obsolete"))]
            if ok:
                out[arm if len(bs) == 1 else f"{b['name']}: {arm}"] = sorted(ok, key=lambda p: p["t"])
    return out


def replay_sections(groups: dict) -> list[str]:
    """Table 9 style: per-arm replay metrics (`metric[arm]`) and per-pair ratios of every timeline benchmark that has
    them, its recorded target verdicts; then the A.2.2 revision-rate matrix rows (`replay_matrix`) as recorded."""
    lines = []
    for b in groups.get("timeline", []):
        ei = b["extra_info"]
        tabs = arm_tables(ei)
        if not tabs:
            continue
        lines += [f"## Recorded-burst replay (Table 9 style): {label(b)}", ""] + ([context(ei), ""] if context(ei) else [])
        lines += [x for t in tabs for x in (t, "")]
        if isinstance(ei.get("targets"), dict) and ei["targets"]:
            lines += ["Targets: " + "; ".join(f"{k}: {'met' if v is True else 'NOT met' if v is False else cell(v)}"
                                              for k, v in ei["targets"].items()), ""]
    for b in groups.get("replay_matrix", []):
        ei = b["extra_info"]
        rows = [{k: cell(v) for k, v in r.items()} for r in ei["replay_matrix"] if isinstance(r, dict)]
        lines += [f"## Revision-rate matrix (A.2.2): {label(b)}", ""] + ([context(ei), ""] if context(ei) else [])
        lines += [md(pd.DataFrame(rows)) if rows else "_no matrix rows_", ""]
        best = [r for r in ei.get("best_native_quantum") or [] if isinstance(r, dict)]
        if best:
            lines += ["Goodput-optimal native quantum per cell:", "",
                      md(pd.DataFrame([{k: cell(v) for k, v in r.items()} for r in best])), ""]
    return lines


def growth_curves(bs: list[dict]) -> list[dict]:
    """Every well-formed curve of the growth benchmarks: {"name", "series": {name: [{"x", "y"}]}, ...}."""
    out = []
    for b in bs:
        for c in b["extra_info"].get("growth_curves") or []:
            if isinstance(c, dict) and isinstance(c.get("series"), dict) and c.get("name"):
                out.append(c)
    return out


def _drawable(c: dict) -> bool:
    return any((med(r.get("y")) or 0) > 0 for rows in c["series"].values() for r in rows if isinstance(r, dict))


def growth_section(c: dict) -> list[str]:
    """One cost-growth curve: its complexity statement, the fitted exponents and a table x | series medians."""
    xs = sorted({r["x"] for rows in c["series"].values() for r in rows if isinstance(r, dict) and "x" in r})
    rows = []
    for x in xs:
        row = {c.get("x_label", "x"): num(x)}
        for name, pts in c["series"].items():
            row[name] = next((cell(r.get("y")) for r in pts if isinstance(r, dict) and r.get("x") == x), None)
        rows.append(row)
    fits = "; ".join(f"{k}: exponent {num(v.get('exponent'))} (r² {num(v.get('r2'))}, {num(v.get('points'))} "
                     f"points)" for k, v in (c.get("fit") or {}).items() if isinstance(v, dict))
    lines = [f"### {c['name'].replace('_', ' ')} ({c.get('y_label', '')})", ""]
    if c.get("complexity"):
        lines += [f"Complexity: {c['complexity']}", ""]
    if fits:
        lines += [f"Log-log fits of the medians: {fits}", ""]
    return lines + [md(pd.DataFrame(rows).replace("–", None)) if rows else "_no points_", ""]


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def report(doc: dict, out: Path) -> list[str]:
    bs = [b for b in doc["benchmarks"] if isinstance(b.get("extra_info"), dict)]
    groups: dict[str, list[dict]] = {}
    for b in bs:
        groups.setdefault(family(b["extra_info"]), []).append(b)
    lines = []
    if "fence_unit" in groups:
        lines += ["## FENCE latency vs prefill unit", "",
                  context(groups["fence_unit"][0]["extra_info"], ("paper_metric", "scenario", "model")), "",
                  fence_unit_table(groups["fence_unit"]), ""]
    if "interruption" in groups:
        lines += ["## Interruption -> successor by LCP position", "",
                  context(groups["interruption"][0]["extra_info"], ("paper_metric", "model")), "",
                  interruption_table(groups["interruption"]), ""]
    for title in ORDER:
        for b in groups.get(title, []):
            lines += [f"## {title}: {label(b)}", "", context(b["extra_info"]), ""]
            lines += [x for t in arm_tables(b["extra_info"]) for x in (t, "")]
    pts = churn_points(groups.get("churn", []))
    if pts:
        df = pd.DataFrame([{k: cell(v) for k, v in p.items()} for p in pts])
        lines += ["## Retained prefix tokens under churn", "", md(df.rename(columns=figures.CHURN_LABELS)), ""]
    sp = churn_speedups(groups.get("churn", []))
    if sp:
        lines += ["## Recovery under churn (speed-up over native-prefix, paired)", "", sp, ""]
    lines += replay_sections(groups)
    tls = timelines(groups.get("timeline", []))
    if tls:
        df = pd.DataFrame([{"arm": a, "samples": len(ps), "t span (s)": f"{num(ps[0]['t'])} .. {num(ps[-1]['t'])}",
                            "peak current": num(max(p["current"] for p in ps)),
                            "peak obsolete": num(max(p["obsolete"] for p in ps))} for a, ps in tls.items()])
        lines += ["## Replay timeline", "", md(df), ""]
    curves = growth_curves(groups.get("growth", []))
    if curves:
        lines += ["## Cost-growth curves", ""]
        for b in groups.get("growth", []):
            lines += [context(b["extra_info"]), ""] if context(b["extra_info"]) else []
        for c in curves:
            lines += growth_section(c)
    for b in groups.get("other", []):
        lines += [f"## Other benchmark: {label(b)}", "", context(b["extra_info"]), "",
                  generic_table(b["extra_info"]), ""]
    if not bs:
        lines += ["_no benchmark with extra_info in this file_", ""]
    fence = [b for b in groups.get("fence_unit", []) if med(b["extra_info"]["prefill_unit_tokens"]) is not None
             and any(med(b["extra_info"].get(f"fence_latency_{a}_s")) is not None for a in ("native", "retire"))]
    return lines + ["## Figures", "",
                    figures.figure("fence_vs_unit.png", out, fence, figures.fence_vs_unit,
                                   "no FENCE-vs-unit data (extra_info 'prefill_unit_tokens' + numeric "
                                   "'fence_latency_native_s' / 'fence_latency_retire_s')"), "",
                    figures.figure("churn.png", out, pts, figures.churn,
                                   "no churn data (extra_info 'churn_curve', or 'churn_fraction' + "
                                   "'retained_tokens_<arm>', with numeric values)"), "",
                    figures.figure("replay_timeline.png", out, tls, figures.replay_timeline,
                                   "no timeline data (extra_info 'timeline': [{'t', 'current', 'obsolete'}] per arm)"),
                    *[x for c in curves for x in ("", figures.figure(
                        f"growth_{c['name']}.png", out, c if _drawable(c) else None, figures.growth,
                        "no positive median to draw on log axes"))]]
