"""`retire demo`, end to end through the console entry point (`retire.cli.main`): the "during-decode" section (section
3, long model on the `long-churn` shape), one trial per policy, with its own engines (subject + stock oracle), as a
user would run it.

Checked: exit status 0; the JSON document it wrote holds one trial per policy; every successor passed its oracle
inside the demo (exact or tolerant, `retire.trials.Judge`); retire published 0 obsolete tokens by the consumer's
clock while native-cold, with the same slow and busy consumer, published at least the 4 tokens the engine produced
while the consumer was busy (the demo's positive control: `BusyConsumer` makes that queue certain however fast the
engine runs; with a consumer only slow per frame this control failed once on a loaded host, 0 published); the
one-screen summary is printed and recorded with the section's measured figures.
"""
from __future__ import annotations

import json

import pytest


@pytest.mark.timeout(600)
def test_retire_demo_runs_through_the_console_entry_point(device, tmp_path, capsys):
    from retire.cli import main

    out = tmp_path / "demo.json"
    rc = main(["demo", "--sections", "during-decode", "--repeats", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    doc = json.loads(out.read_text())
    (section,) = doc["sections"]
    trials = {t["policy"]: t for t in section["trials"]}
    assert sorted(trials) == ["native-cold", "native-prefix", "retire"]
    assert all(t["ok"] for t in trials.values()), [(p, t["verdict"]) for p, t in trials.items()]
    assert trials["retire"]["obsolete_tokens_published"] == 0 == doc["retire_obsolete"]
    assert trials["native-cold"]["obsolete_tokens_published"] >= 4, "positive control: native publishes obsolete"
    assert "3: revision during decode" in printed and doc["failed"] == 0
    (head,) = doc["headline"]
    assert head["id"] == "during-decode" and head["oracle_pass"] == head["trials"] == 3
    assert head["obsolete_published"]["retire"] == 0 < head["obsolete_published"]["native-cold"]
    assert "| 3 decode, slow consumer |" in printed


def _rows(ttfts: dict, obsolete=0, ok=True):
    return [{"repeat": r, "policy": p, "obsolete_tokens_published": obsolete, "successor_ttft_s": ts[r],
             "tokens_reused": 0 if p == "native-cold" else 2048, "fence_latency_s": 0.1, "wall_s": 1.0,
             "fence_path": "safe-point" if p == "retire" else "native-abort", "ok": ok or p != "retire",
             "verdict": "tolerant vs clean_run" if ok or p != "retire" else "FAIL: x"}
            for p, ts in ttfts.items() for r in range(len(ts))]


def test_demo_summary_is_computed_from_the_measured_rows():
    """Engine-free: the one-screen summary's ratios are medians of per-repeat paired ratios; an obsolete count a
    section does not measure is "n/a", never 0; a failed successor lowers the oracle count (negative control)."""
    from retire.demo.summary import headline, headline_table, paired_ratio, summarize

    rows = _rows({"native-cold": [6.0, 9.0, 6.6], "native-prefix": [5.0, 8.0, 4.0], "retire": [1.0, 1.0, 2.0]})
    assert paired_ratio(rows, "native-prefix", "retire") == 5.0  # ratios 5, 8, 2 (cold: 6, 9, 3.3)
    sec = {"id": "in-step", "number": 1, "summary": summarize(rows), "trials": rows}
    h = headline(sec)
    assert (h["oracle_pass"], h["trials"]) == (9, 9) and h["retire_fence_paths"] == {"safe-point": 3}
    assert h["tokens_reused_median"] == {"native-cold": 0, "native-prefix": 2048, "retire": 2048}
    cells = [c.strip() for c in headline_table([h]).splitlines()[-1].strip("|").split("|")]
    assert cells == ["1 in-step, obsolete work", "5.00x", "6.00x", "0/0/0", "0/2048/2048", "safe-point 3", "9/9 pass"]
    bad = _rows({"native-prefix": [5.0], "retire": [1.0]}, obsolete=None, ok=False)
    hb = headline({"id": "churn", "number": 2, "summary": summarize(bad), "trials": bad})
    assert (hb["oracle_pass"], hb["trials"]) == (1, 2)
    assert hb["obsolete_published"]["retire"] is None and " n/a " in headline_table([hb])
