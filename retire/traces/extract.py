"""Extract supersession *transitions* from coding-agent session logs (JSON Lines).

Input format (one JSON object per line, as written by coding-agent CLIs)::

    {"timestamp": "2025-10-01T12:00:00.000Z", "type": "session_meta", "payload": {"id": "THREAD", ...}}
    {"timestamp": "2025-10-01T12:00:05.000Z", "type": "event_msg",
     "payload": {"type": "turn_aborted", "turn_id": "..."}}
    {"timestamp": "2025-10-01T12:00:07.000Z", "type": "event_msg",
     "payload": {"type": "task_started", "turn_id": "..."}}

Contract
--------
* **Scope** (thread) of a line = ``payload.id`` of the most recent ``session_meta`` line
  before it in the same file.  Lines before the first ``session_meta`` of a file take the
  first ``session_meta`` id of that file; a file with no usable ``session_meta`` uses the
  file stem, and is counted in ``ExtractReport.files_without_meta``.  Files that share a
  thread id (e.g. a resumed session) are merged into one thread.
* **Transition** = a ``turn_aborted`` followed (in time order, within the same thread) by
  the next ``task_started`` at most ``max_gap`` (default one hour, inclusive) later.
  The transition's time is the **task_started** time: that is the moment the superseding
  request arrives at the server, which is what a replay must reproduce.  Only
  ``turn_aborted``/``task_started`` take part in the pairing; other events in between do not
  break it.  Of several consecutive aborts, the latest one is paired.  Each abort pairs at
  most once.
* Problems are counted, never raised: ``malformed`` (not JSON, or JSON but not an object),
  ``missing_fields`` (a field this extractor needs is absent, has the wrong type, or the
  timestamp does not parse), ``unknown_types`` (a ``Counter`` keyed by the top-level type,
  or ``"event_msg/<payload type>"`` for unknown ``event_msg`` subtypes).  Blank lines are
  counted in ``blank`` only.  Fields are validated only where they are used: ``timestamp``
  and ``type`` on every line, ``payload.id`` on ``session_meta``, ``payload.type`` on
  ``event_msg``.
* Output: ``DataFrame[scope: str, time: datetime64[ns, UTC]]`` sorted by (time, scope),
  index ``0..n-1``.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence, Union

import numpy as np
import pandas as pd

PathLike = Union[str, "os.PathLike[str]"]

#: Top-level line types we recognise (anything else counts in ``unknown_types``).
KNOWN_TOP_TYPES: frozenset[str] = frozenset(
    {"session_meta", "event_msg", "response_item", "turn_context", "compacted"}
)

#: ``event_msg`` payload types we recognise.  Only ``turn_aborted`` and ``task_started``
#: matter for transitions; the rest are known-but-irrelevant (not "unknown").
KNOWN_EVENT_TYPES: frozenset[str] = frozenset(
    {
        "task_started", "task_complete", "turn_aborted",
        "token_count", "agent_message", "agent_message_delta", "user_message",
        "agent_reasoning", "agent_reasoning_delta", "agent_reasoning_raw_content",
        "agent_reasoning_section_break",
        "exec_command_begin", "exec_command_end", "exec_command_output_delta",
        "exec_approval_request", "apply_patch_approval_request",
        "patch_apply_begin", "patch_apply_end",
        "mcp_tool_call_begin", "mcp_tool_call_end", "web_search_begin", "web_search_end",
        "view_image_tool_call", "plan_update", "turn_diff", "background_event",
        "error", "stream_error", "entered_review_mode", "exited_review_mode",
        "context_compacted", "shutdown_complete", "get_history_entry_response",
    }
)

ABORT, START = "turn_aborted", "task_started"
DEFAULT_MAX_GAP = pd.Timedelta(hours=1)


@dataclass
class ExtractReport:
    """Counters describing one extraction.  Every input line lands in exactly one of
    ``blank``, ``malformed``, ``missing_fields``, ``unknown`` (sum of ``unknown_types``) or
    ``events`` (recognised lines); so ``lines == blank + malformed + missing_fields +
    sum(unknown_types.values()) + events``."""

    files: int = 0
    lines: int = 0
    blank: int = 0
    malformed: int = 0
    missing_fields: int = 0
    unknown_types: Counter = field(default_factory=Counter)
    events: int = 0
    files_without_meta: int = 0
    aborts: int = 0
    starts: int = 0
    transitions: int = 0
    stale_pairs: int = 0  # abort -> next start more than max_gap later (not a transition)
    threads: int = 0

    def summary(self) -> dict:
        """JSON-friendly dict of all counters."""
        d = dict(self.__dict__)
        d["unknown_types"] = dict(sorted(self.unknown_types.items()))
        return d


def parse_timestamp(value: object) -> int | None:
    """ISO-8601 string -> UTC epoch nanoseconds, or ``None`` if it does not parse.
    Naive timestamps are taken as UTC."""
    if not isinstance(value, str) or not value:
        return None
    s = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        if not value[:4].isdigit():  # keep pandas from accepting "now", "today", ...
            return None
        try:
            ts = pd.Timestamp(value)
        except (ValueError, TypeError):
            return None
        if ts is pd.NaT:
            return None
        ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
        return int(ts.as_unit("ns").value)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    delta = dt - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def iter_log_files(paths_or_folder: PathLike | Sequence[PathLike]) -> list[Path]:
    """Resolve the extractor's input to a sorted list of files: a file is taken as is;
    a folder contributes every ``*.jsonl`` below it (recursively)."""
    items: Iterable[PathLike]
    if isinstance(paths_or_folder, (str, os.PathLike)):
        items = [paths_or_folder]
    else:
        items = paths_or_folder
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*.jsonl") if q.is_file()))
        else:
            out.append(p)
    return out


def _scan_file(path: Path, report: ExtractReport) -> list[tuple[int, str, str | None]]:
    """Read one file; return (time_ns, kind, thread) for every abort/start, with the
    thread already resolved per the module contract."""
    events: list[tuple[int, str, str | None]] = []
    current: str | None = None
    first_meta: str | None = None
    with open(path, "r", encoding="utf-8", errors="replace") as fh:
        for raw in fh:
            report.lines += 1
            if not raw.strip():
                report.blank += 1
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                report.malformed += 1
                continue
            if not isinstance(obj, dict):
                report.malformed += 1
                continue
            kind = obj.get("type")
            t_ns = parse_timestamp(obj.get("timestamp"))
            if not isinstance(kind, str) or t_ns is None:
                report.missing_fields += 1
                continue
            if kind not in KNOWN_TOP_TYPES:
                report.unknown_types[kind] += 1
                continue
            payload = obj.get("payload")
            if kind == "session_meta":
                tid = payload.get("id") if isinstance(payload, dict) else None
                if not isinstance(tid, str) or not tid:
                    report.missing_fields += 1
                    continue
                current = tid
                first_meta = first_meta or tid
            elif kind == "event_msg":
                ptype = payload.get("type") if isinstance(payload, dict) else None
                if not isinstance(ptype, str):
                    report.missing_fields += 1
                    continue
                if ptype not in KNOWN_EVENT_TYPES:
                    report.unknown_types[f"event_msg/{ptype}"] += 1
                    continue
                if ptype in (ABORT, START):
                    events.append((t_ns, ptype, current))
            report.events += 1
    if first_meta is None:
        report.files_without_meta += 1
        first_meta = path.stem
    return [(t, k, th if th is not None else first_meta) for t, k, th in events]


def pair_transitions(
    events: Iterable[tuple[int, str, str]], max_gap_ns: int, report: ExtractReport
) -> list[tuple[str, int]]:
    """Pair aborts with the next start per thread (module contract); returns
    (scope, time_ns) of each transition, unsorted."""
    by_thread: dict[str, list[tuple[int, int, str]]] = {}
    for seq, (t, kind, th) in enumerate(events):
        # (time, seq) keeps file order for equal timestamps
        by_thread.setdefault(th, []).append((t, seq, kind))
    report.threads = len(by_thread)
    out: list[tuple[str, int]] = []
    for th, evs in by_thread.items():
        evs.sort()
        pending: int | None = None
        for t, _, kind in evs:
            if kind == ABORT:
                report.aborts += 1
                pending = t
            else:
                report.starts += 1
                if pending is not None:
                    if t - pending <= max_gap_ns:
                        out.append((th, t))
                    else:
                        report.stale_pairs += 1
                pending = None
    report.transitions = len(out)
    return out


def transitions_frame(scopes: Sequence[str], times_ns: Sequence[int] | np.ndarray) -> pd.DataFrame:
    """Build the canonical ``DataFrame[scope: str, time: datetime64[ns, UTC]]``, sorted by
    (time, scope), index reset."""
    t = pd.to_datetime(np.asarray(times_ns, dtype="int64"), unit="ns", utc=True).as_unit("ns")
    df = pd.DataFrame({"scope": pd.Series(list(scopes), dtype=str), "time": t})
    return df.sort_values(["time", "scope"], kind="stable").reset_index(drop=True)


def extract_transitions(
    paths_or_folder: PathLike | Sequence[PathLike],
    max_gap: pd.Timedelta | float = DEFAULT_MAX_GAP,
) -> tuple[pd.DataFrame, ExtractReport]:
    """Extract transitions from a file, a list of files, or a folder (recursive ``*.jsonl``).

    ``max_gap`` is a ``Timedelta`` or seconds.  Never raises on bad content; unreadable
    paths (missing files) do raise ``OSError``.  See the module docstring for the contract.
    """
    gap = max_gap if isinstance(max_gap, pd.Timedelta) else pd.Timedelta(seconds=float(max_gap))
    report = ExtractReport()
    events: list[tuple[int, str, str]] = []
    for path in iter_log_files(paths_or_folder):
        report.files += 1
        events.extend(_scan_file(path, report))  # type: ignore[arg-type]
    pairs = pair_transitions(events, int(gap.value), report)
    return transitions_frame([s for s, _ in pairs], [t for _, t in pairs]), report
