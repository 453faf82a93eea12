"""`retire demo`, end to end through the console entry point (`retire.cli.main`), on the unit model: the
"during-decode" section, one trial per policy, with its own engines (subject + stock oracle), as a user would run it.

Checked: exit status 0; the JSON document it wrote holds one trial per policy; every successor passed its oracle
inside the demo (exact or tolerant, `retire.trials.Judge`); retire published 0 obsolete tokens by the consumer's
clock while native-cold, with the same slow consumer, published some (the demo's positive control).
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
    assert trials["native-cold"]["obsolete_tokens_published"] > 0, "positive control: native publishes obsolete"
    assert "B: revision during decode" in printed and doc["failed"] == 0
