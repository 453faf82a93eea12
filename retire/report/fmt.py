"""Cell formatting for `retire report`: values are printed as recorded (up to 6 significant digits), never
recomputed."""
from __future__ import annotations

import math

import pandas as pd


def num(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


def fix(x, nd: int) -> str:
    return f"{x:.{nd}f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "–"


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
    """A GitHub-markdown table of a DataFrame (all cells as strings; '|' escaped; missing -> '–')."""
    df = df.fillna("–").astype(str).map(lambda s: s.replace("|", "\\|"))
    rows = [list(df.columns), ["---"] * len(df.columns), *df.values.tolist()]
    return "\n".join("| " + " | ".join(map(str, r)) + " |" for r in rows)
