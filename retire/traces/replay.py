"""Replay format for transition traces, and window -> replay schedule.

File format (JSON Lines, UTF-8, ``\\n`` line ends)::

    {"kind": "retire-trace", "version": 1, "source": "...", "n": 24, "t0": "2025-01-01T00:00:00+00:00"}
    {"scope": "thread-017", "t": 0.0}
    {"scope": "thread-017", "t": 0.41}
    ...

Contract
--------
* Line 1 is the header; ``n`` is the number of transition lines that follow; ``t0`` is the
  ISO-8601 UTC origin; each ``t`` is seconds from ``t0`` (float, >= 0), lines in
  non-decreasing ``t`` order.  Keys are written in a fixed order, so the same frame always
  yields the same bytes.
* Precision is one microsecond: ``t`` is written as ``round(offset_us) / 1e6`` and read back
  as ``round(t * 1e6)`` microseconds, so frames whose times are microsecond-aligned
  round-trip exactly (``read_trace_jsonl(write_trace_jsonl(df)) == df``).
* ``read_trace_jsonl`` raises ``ValueError`` on a bad header, a count mismatch, or a bad
  line: a replay file is a fixture, not field data, so it is validated strictly.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np
import pandas as pd

from .extract import PathLike, transitions_frame
from .window import times_ns

if TYPE_CHECKING:
    from .window import WindowStats

TRACE_KIND = "retire-trace"
TRACE_VERSION = 1


def _offsets_us(ns: np.ndarray, t0_ns: int) -> np.ndarray:
    """Offsets from t0 in whole microseconds (round half to even, as numpy does)."""
    return np.rint((ns - t0_ns) / 1e3).astype("int64")


def write_trace_jsonl(
    df: pd.DataFrame,
    path: PathLike,
    source: str = "",
    t0: Optional[pd.Timestamp] = None,
) -> Path:
    """Write ``df`` (columns ``scope``, ``time``) in the replay format.  ``t0`` defaults to
    the earliest transition (or the Unix epoch for an empty frame).  Returns the path."""
    ns = times_ns(df)
    order = np.lexsort((df["scope"].astype(str).to_numpy(), ns))
    ns = ns[order]
    scopes = df["scope"].astype(str).to_numpy()[order]
    if t0 is None:
        t0_ns = int(ns[0]) if ns.size else 0
    else:
        t0_ns = int(pd.Timestamp(t0).tz_convert("UTC").as_unit("ns").value)
    offs = _offsets_us(ns, t0_ns)
    if offs.size and offs[0] < 0:
        raise ValueError("t0 is after the first transition")
    header = {
        "kind": TRACE_KIND,
        "version": TRACE_VERSION,
        "source": source,
        "n": int(ns.size),
        "t0": pd.Timestamp(t0_ns, unit="ns", tz="UTC").isoformat(),
    }
    lines = [json.dumps(header)]
    lines += [json.dumps({"scope": s, "t": int(u) / 1e6}) for s, u in zip(scopes, offs)]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def read_trace_jsonl(path: PathLike) -> pd.DataFrame:
    """Read a replay file into the canonical frame; the header dict is in
    ``df.attrs["trace_header"]``."""
    text = Path(path).read_text(encoding="utf-8").splitlines()
    if not text:
        raise ValueError(f"{path}: empty trace file")
    header = json.loads(text[0])
    if not isinstance(header, dict) or header.get("kind") != TRACE_KIND:
        raise ValueError(f"{path}: not a {TRACE_KIND} file")
    if header.get("version") != TRACE_VERSION:
        raise ValueError(f"{path}: unsupported version {header.get('version')!r}")
    body = [ln for ln in text[1:] if ln.strip()]
    if header.get("n") != len(body):
        raise ValueError(f"{path}: header says n={header.get('n')}, found {len(body)} lines")
    t0_ns = int(pd.Timestamp(header["t0"]).tz_convert("UTC").as_unit("ns").value)
    scopes: list[str] = []
    ns: list[int] = []
    for k, ln in enumerate(body, start=2):
        rec = json.loads(ln)
        if not isinstance(rec, dict) or not isinstance(rec.get("scope"), str):
            raise ValueError(f"{path}:{k}: bad record {ln!r}")
        t = rec.get("t")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
            raise ValueError(f"{path}:{k}: bad t {t!r}")
        scopes.append(rec["scope"])
        ns.append(t0_ns + int(round(t * 1e6)) * 1000)
    df = transitions_frame(scopes, ns)
    df.attrs["trace_header"] = header
    return df


def window_to_replay(df: pd.DataFrame, window: "WindowStats") -> list[tuple[float, str]]:
    """Transitions of ``df`` inside ``[window.start, window.end)`` as
    ``(seconds since window.start, scope)``, in time order (ties by scope)."""
    if window.start is None or window.end is None:
        return []
    ns = times_ns(df)
    s0 = int(window.start.as_unit("ns").value)
    s1 = int(window.end.as_unit("ns").value)
    mask = (ns >= s0) & (ns < s1)
    sub = sorted(zip(ns[mask].tolist(), df["scope"].astype(str).to_numpy()[mask].tolist()))
    return [((t - s0) / 1e9, s) for t, s in sub]
