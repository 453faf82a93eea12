"""Conformance tests for retire.traces (issue 6, "Trace tooling").

Fast (whole file well under 10 s), no sleeps, no vllm/torch.  Fixtures:
``fixtures/agent_logs/`` (hand-written session logs, some deliberately malformed) and
``fixtures/trace_paper_window.jsonl`` (generated; must equal what the code produces).
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from retire.traces import (
    PAPER,
    densest_window,
    extract_transitions,
    main,
    read_trace_jsonl,
    synthesize,
    transitions_frame,
    window_to_replay,
    write_synth_window,
    write_trace_jsonl,
)

FIX = Path(__file__).parent / "fixtures"
LOGS = FIX / "agent_logs"
PAPER_WINDOW = FIX / "trace_paper_window.jsonl"


def ts(s: str) -> pd.Timestamp:
    return pd.Timestamp(s, tz="UTC")


def frame(pairs: list[tuple[str, float]], t0: str = "2025-01-01T00:00:00") -> pd.DataFrame:
    """Transition frame from (scope, seconds since t0)."""
    base = ts(t0).value
    return transitions_frame([s for s, _ in pairs], [base + int(round(x * 1e9)) for _, x in pairs])


def rows(df: pd.DataFrame) -> list[tuple[str, pd.Timestamp]]:
    return list(zip(df["scope"].tolist(), df["time"].tolist()))


def meta(t: str, tid: str) -> str:
    return json.dumps({"timestamp": t, "type": "session_meta", "payload": {"id": tid}})


def ev(t: str, kind: str) -> str:
    return json.dumps({"timestamp": t, "type": "event_msg", "payload": {"type": kind, "turn_id": "x"}})


def write_log(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------- extractor


def test_extract_clean_session_pairs_abort_with_next_start():
    """session_a: two transitions (events in between don't break a pair); the abort at
    10:12 followed by a start 1 h + 1 ms later is not a transition (stale pair)."""
    df, rep = extract_transitions(LOGS / "session_a.jsonl")
    assert rows(df) == [
        ("thread-a", ts("2025-10-01T10:00:32")),
        ("thread-a", ts("2025-10-01T10:05:10")),
    ]
    assert list(df.columns) == ["scope", "time"]
    assert str(df["time"].dtype) == "datetime64[ns, UTC]"
    assert (rep.files, rep.lines, rep.events) == (1, 18, 18)
    assert (rep.malformed, rep.missing_fields, rep.blank, sum(rep.unknown_types.values())) == (0, 0, 0, 0)
    assert (rep.aborts, rep.starts, rep.transitions, rep.stale_pairs) == (3, 5, 2, 1)


def test_extract_counts_bad_lines_exactly_and_never_raises():
    """session_b: 18 lines = 1 blank + 3 malformed + 5 missing-field + 3 unknown + 6 events.
    The 1-hour limit is inclusive (abort 10:02:00 -> start 11:02:00 is a transition)."""
    df, rep = extract_transitions(LOGS / "session_b.jsonl")
    assert rows(df) == [
        ("thread-b", ts("2025-10-01T11:02:00")),
        ("thread-b", ts("2025-10-01T12:00:03.250")),
    ]
    assert rep.lines == 18
    assert rep.blank == 1
    assert rep.malformed == 3  # truncated JSON, a JSON array, plain text
    assert rep.missing_fields == 5  # no timestamp, bad timestamp, no payload, no payload.type, meta w/o id
    assert rep.unknown_types == {"mystery_line": 1, "event_msg/teleport_started": 2}
    assert rep.events == 6
    assert rep.lines == rep.blank + rep.malformed + rep.missing_fields + sum(rep.unknown_types.values()) + rep.events
    assert rep.files_without_meta == 0


def test_extract_folder_is_recursive_and_totals_are_exact():
    df, rep = extract_transitions(LOGS)
    assert rows(df) == [
        ("no_meta_c", ts("2025-10-01T09:00:04")),  # nested/, no session_meta -> file stem
        ("thread-a", ts("2025-10-01T10:00:32")),
        ("thread-a", ts("2025-10-01T10:05:10")),
        ("thread-b", ts("2025-10-01T11:02:00")),
        ("thread-b", ts("2025-10-01T12:00:03.250")),
    ]
    assert df["time"].is_monotonic_increasing
    assert (rep.files, rep.lines, rep.files_without_meta, rep.threads) == (6, 49, 1, 7)
    assert (rep.blank, rep.malformed, rep.missing_fields) == (1, 3, 5)
    assert rep.unknown_types == {"mystery_line": 1, "event_msg/teleport_started": 2}


def test_extract_accepts_list_of_files():
    df, rep = extract_transitions([LOGS / "session_a.jsonl", str(LOGS / "nested" / "no_meta_c.jsonl")])
    assert df["scope"].tolist() == ["no_meta_c", "thread-a", "thread-a"]
    assert rep.files == 2 and rep.files_without_meta == 1


def test_negative_control_cross_thread_pairs_yield_nothing(tmp_path):
    """Every abort->start pair in negative/ crosses threads (within one file via a second
    session_meta, and across two files 1 s apart): zero transitions.  Control: the same
    log with the second session_meta naming the first thread yields exactly one."""
    df, rep = extract_transitions(LOGS / "negative")
    assert len(df) == 0 and rep.transitions == 0
    assert (rep.aborts, rep.starts, rep.threads) == (2, 4, 4)

    text = (LOGS / "negative" / "cross_thread.jsonl").read_text().replace('"neg-y"', '"neg-x"')
    same = tmp_path / "same_thread.jsonl"
    same.write_text(text)
    df2, _ = extract_transitions(same)
    assert rows(df2) == [("neg-x", ts("2025-10-02T08:00:12"))]


def test_lines_before_first_meta_and_resumed_sessions(tmp_path):
    """Lines before a file's first session_meta belong to that thread; two files with the
    same thread id are one thread (a resumed session pairs across them)."""
    write_log(tmp_path / "a.jsonl", [ev("2025-01-01T00:00:00Z", "turn_aborted"), meta("2025-01-01T00:00:01Z", "T")])
    write_log(tmp_path / "b.jsonl", [meta("2025-01-01T00:00:02Z", "T"), ev("2025-01-01T00:00:03Z", "task_started")])
    df, rep = extract_transitions(tmp_path)
    assert rows(df) == [("T", ts("2025-01-01T00:00:03"))]
    assert rep.files_without_meta == 0 and rep.threads == 1


def test_latest_abort_pairs_once_and_order_is_by_time(tmp_path):
    """Aborts at 0 s and 10 s then starts at 20 s and 30 s: one transition at 20 s (the
    second start has no pending abort).  Lines out of time order are sorted first."""
    lines = [
        meta("2025-01-01T00:00:00Z", "T"),
        ev("2025-01-01T00:00:30Z", "task_started"),
        ev("2025-01-01T00:00:00Z", "turn_aborted"),
        ev("2025-01-01T00:00:20+00:00", "task_started"),
        ev("2025-01-01T00:00:10", "turn_aborted"),  # naive -> UTC
    ]
    df, rep = extract_transitions(write_log(tmp_path / "t.jsonl", lines))
    assert rows(df) == [("T", ts("2025-01-01T00:00:20"))]
    assert (rep.aborts, rep.starts, rep.transitions) == (2, 2, 1)


def test_max_gap_parameter(tmp_path):
    p = write_log(tmp_path / "t.jsonl", [
        meta("2025-01-01T00:00:00Z", "T"),
        ev("2025-01-01T00:00:00Z", "turn_aborted"),
        ev("2025-01-01T00:00:30Z", "task_started"),
    ])
    assert len(extract_transitions(p, max_gap=30.0)[0]) == 1
    df, rep = extract_transitions(p, max_gap=29.999)
    assert len(df) == 0 and rep.stale_pairs == 1


# ------------------------------------------------------------ densest window


def test_densest_window_known_answer():
    """Events at 0, 1, 2 (A) | 150, 150.5, 151, 200, 201 (B, C) | 210 (A) | 300 (D).  The 60 s
    window anchored at 150 holds 5 (the one anchored at 150.5 also holds 5: the earlier
    wins); half-open, so the event at exactly start + 60 = 210 is excluded."""
    df = frame([("A", 0), ("A", 1), ("A", 2), ("B", 150), ("C", 150.5), ("B", 151),
                ("C", 200), ("C", 201), ("A", 210), ("D", 300)])
    w = densest_window(df, 60.0)
    assert w.count == 5
    assert w.start == ts("2025-01-01T00:02:30") and w.end == ts("2025-01-01T00:03:30")
    assert w.scopes == ["B", "C"]
    assert w.bursts == [3, 2]  # gaps 0.5, 0.5, 49, 1
    gaps = np.array([0.5, 0.5, 49.0, 1.0])
    assert w.cv == pytest.approx(gaps.std() / gaps.mean())  # population std
    assert w.transitions["time"].tolist() == [ts("2025-01-01T00:02:30"), ts("2025-01-01T00:02:30.5"),
                                              ts("2025-01-01T00:02:31"), ts("2025-01-01T00:03:20"),
                                              ts("2025-01-01T00:03:21")]
    assert densest_window(frame([("A", 0), ("A", 10)]), 10.0).count == 1  # [0, 10) excludes 10


def test_densest_window_ties_pick_earliest():
    df = frame([("X", 300), ("X", 301), ("Y", 10), ("Y", 11), ("Z", 500), ("Z", 501)])
    w = densest_window(df, 5.0)
    assert (w.count, w.start, w.scopes) == (2, ts("2025-01-01T00:00:10"), ["Y"])


def test_densest_window_burst_gap_and_edge_cases():
    df = frame([("A", 0), ("A", 2), ("A", 4.5), ("A", 5)])
    assert densest_window(df, 10).bursts == [2, 2]  # gap 2.0 joins (<=), 2.5 splits
    assert densest_window(df, 10, burst_gap=3).bursts == [4]
    one = densest_window(frame([("A", 0)]), 10)
    assert (one.count, one.bursts) == (1, [1]) and math.isnan(one.cv)
    empty = densest_window(frame([]), 10)
    assert (empty.count, empty.start, empty.bursts) == (0, None, [])
    with pytest.raises(ValueError, match="seconds must be > 0"):
        densest_window(df, 0)


# --------------------------------------------------------------- generator


def test_synthesize_reproduces_paper_statistics():
    """Targets from the paper; tolerance: counts are exact (751 transitions, 345 scopes,
    densest 120 s window = 24 transitions, 3 scopes, bursts [8, 8, 8] at burst_gap 2 s),
    span <= 30 days, inter-arrival CV within 3.57 +/- 0.1 (the generator solves it to
    ~1e-6; microsecond rounding moves it far less than the tolerance)."""
    df = synthesize(seed=0)
    assert len(df) == PAPER.n == 751
    assert df["scope"].nunique() == PAPER.scopes == 345
    assert df["time"].max() - df["time"].min() <= pd.Timedelta(days=30)
    assert df["time"].is_monotonic_increasing
    assert str(df["time"].dtype) == "datetime64[ns, UTC]"
    w = densest_window(df, 120.0)
    assert w.count == 24
    assert len(w.scopes) == 3
    assert w.bursts == [8, 8, 8]
    assert abs(w.cv - 3.57) <= 0.1
    # one scope per burst, and no other window comes close
    assert [w.transitions["scope"].iloc[i * 8: i * 8 + 8].nunique() for i in range(3)] == [1, 1, 1]
    rest = df[(df["time"] < w.start) | (df["time"] >= w.end)]
    assert densest_window(rest, 120.0).count < 24


def test_synthesize_deterministic_per_seed_and_seeds_differ():
    a, b, c = synthesize(seed=0), synthesize(seed=0), synthesize(seed=1)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)
    wc = densest_window(c, 120.0)
    assert (len(c), c["scope"].nunique(), wc.count, wc.bursts) == (751, 345, 24, [8, 8, 8])
    assert abs(wc.cv - 3.57) <= 0.1


# ---------------------------------------------------- replay format & fixture


def test_committed_fixture_matches_generator(tmp_path):
    """The committed fixture is byte-identical to synthesize(seed=0)'s densest 120 s window
    written in the replay format, so it cannot drift from the code."""
    out = tmp_path / "w.jsonl"
    w = write_synth_window(out, seed=0, seconds=120.0)
    assert out.read_bytes() == PAPER_WINDOW.read_bytes()
    lines = PAPER_WINDOW.read_text().splitlines()
    assert len(lines) == 25
    header = json.loads(lines[0])
    assert header["kind"] == "retire-trace" and header["version"] == 1 and header["n"] == 24
    fix = read_trace_jsonl(PAPER_WINDOW)
    pd.testing.assert_frame_equal(fix, w.transitions)
    fw = densest_window(fix, 120.0)
    assert (fw.count, fw.bursts, len(fw.scopes)) == (24, [8, 8, 8], 3) and abs(fw.cv - 3.57) <= 0.1


def test_cli_synth_writes_the_fixture(tmp_path, capsys):
    out = tmp_path / "cli.jsonl"
    assert main(["synth", "--seed", "0", "--window", "120", "--out", str(out)]) == 0
    assert out.read_bytes() == PAPER_WINDOW.read_bytes()
    assert json.loads(capsys.readouterr().out)["bursts"] == [8, 8, 8]


def test_replay_round_trip_full_trace(tmp_path):
    df = synthesize(seed=3)
    p = write_trace_jsonl(df, tmp_path / "full.jsonl", source="test")
    back = read_trace_jsonl(p)
    pd.testing.assert_frame_equal(back, df)
    assert back.attrs["trace_header"]["n"] == 751
    assert p.read_text().count("\n") == 752


def test_read_trace_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "retire-trace", "version": 1, "source": "", "n": 2, "t0": "2025-01-01T00:00:00+00:00"}\n'
                   '{"scope": "a", "t": 0.0}\n')
    with pytest.raises(ValueError, match="header says n=2, found 1 lines"):
        read_trace_jsonl(bad)
    bad.write_text('{"kind": "something-else", "version": 1}\n')
    with pytest.raises(ValueError, match="not a retire-trace file"):
        read_trace_jsonl(bad)


def test_window_to_replay_offsets_match_fixture():
    df = synthesize(seed=0)
    w = densest_window(df, 120.0)
    sched = window_to_replay(df, w)
    assert len(sched) == 24 and sched[0][0] == 0.0
    assert all(0.0 <= t < 120.0 for t, _ in sched)
    assert [t for t, _ in sched] == sorted(t for t, _ in sched)
    recs = [json.loads(x) for x in PAPER_WINDOW.read_text().splitlines()[1:]]
    assert [(r["t"], r["scope"]) for r in recs] == [(round(t, 6), s) for t, s in sched]


def test_cli_extract_then_window(tmp_path, capsys):
    logs = tmp_path / "logs"
    shutil.copytree(LOGS, logs)
    csv = tmp_path / "t.csv"
    assert main(["extract", str(logs), "--out", str(csv)]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (rep["transitions"], rep["malformed"], rep["missing_fields"]) == (5, 3, 5)
    assert main(["window", str(csv), "--seconds", "3600"]) == 0
    stats = json.loads(capsys.readouterr().out)
    # 10:00:32 .. 11:00:32 holds thread-a's two transitions
    assert (stats["count"], stats["scopes"]) == (2, ["thread-a"])
