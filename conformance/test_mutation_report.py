"""`make mutate`'s classification check (conformance/mutation_report.py), engine-free.

Guarantee: a surviving mutant passes `--documented` only if a classification table row names it with a verdict that
lets it survive (equivalent, accepted, not exercised, caught by a crash, killed outside mutmut). A name met in prose,
or in a row saying a test kills it, does not classify it. A row whose line no longer matches its mutant's is noted.
Oracle: hand-written documents and result maps; the real docs/mutation.md for the negative control.
Negative control: `_pid_alive__mutmut_5` survived the full runs of 2026-12-07 (a test that could not fail under
`nohup`) and `make mutate` still exited 0, because docs/mutation.md named it, in prose, as killed; the check must
report it now.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from conformance.mutation_report import _row_lines, classified, stale_locations, undocumented

pytestmark = pytest.mark.timeout(60)

DOC = """\
Prose naming `f__mutmut_9` as killed.

| location | mutant | mutation | verdict | why |
| --- | --- | --- | --- | --- |
| x.py:1 | `f__mutmut_1`, `f__mutmut_2` | a → b | equivalent | same value |
| x.py:2 | `C.m__mutmut_3` (suspicious) | c → d | caught by a crash | the kernel aborts |
| x.py:3 | `f__mutmut_4` | e → f | missing test, added | now killed |
| x.py:4 | `f__mutmut_5` | g → h | **not exercised under the harness** | no such work item |
| x.py:5 | `f__mutmut_6` | i → j | killed after the full run | a test was added |
"""

SURVIVED, KILLED = 0, 1


def test_only_rows_whose_verdict_lets_the_mutant_survive_classify_it():
    assert classified(DOC) == {"f__mutmut_1", "f__mutmut_2", "C.m__mutmut_3", "f__mutmut_5"}


def test_a_survivor_named_in_prose_or_in_a_killed_row_is_reported(tmp_path):
    doc = tmp_path / "mutation.md"
    doc.write_text(DOC)
    res = {"retire/x.py": {f"retire.x.x_f__mutmut_{n}": SURVIVED for n in (1, 2, 4, 5, 6, 9)}
           | {"retire.x.xǁCǁm__mutmut_3": 35, "retire.x.x_f__mutmut_7": KILLED}}
    assert undocumented(res, doc) == ["retire/x.py: f__mutmut_4", "retire/x.py: f__mutmut_6",
                                      "retire/x.py: f__mutmut_9"]


def test_negative_control_the_shm_mutant_that_survived_under_nohup_is_caught():
    doc = Path(__file__).resolve().parent.parent / "docs" / "mutation.md"
    assert "`_pid_alive__mutmut_5`" in doc.read_text()  # named in prose: the old check counted that as classified
    res = {"retire/shm.py": {"retire.shm.x__pid_alive__mutmut_5": SURVIVED}}
    assert undocumented(res, doc) == ["retire/shm.py: _pid_alive__mutmut_5"]


def test_row_locations_read_single_lines_ranges_and_lists():
    assert _row_lines("mailbox.py:171–174") == ("mailbox.py", {171, 172, 173, 174})
    assert _row_lines("slicing.py:300, 302") == ("slicing.py", {300, 302})
    assert _row_lines("x.py:5") == ("x.py", {5})


def test_a_row_whose_line_drifted_from_its_mutant_is_noted():
    found = [("retire/x.py", 1, "f__mutmut_1"), ("retire/x.py", 9, "f__mutmut_2"), ("retire/y.py", 1, "f__mutmut_5"),
             ("retire/x.py", 7, "g__mutmut_1"), ("retire/ax.py", 4, "f__mutmut_5")]
    # f_1 at its row's line; f_2 drifted (row x.py:1); f_5's row names x.py, neither y.py nor ax.py (a file name is
    # matched whole); g_1 has no row at all
    assert stale_locations(found, DOC) == ["retire/x.py:9: f__mutmut_2 (row: x.py:1)",
                                           "retire/y.py:1: f__mutmut_5 (row: x.py:4)",
                                           "retire/ax.py:4: f__mutmut_5 (row: x.py:4)"]
