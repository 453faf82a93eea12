"""The resumable no-revision ledger (perf/pairs_ledger.py), engine-free: it runs in the default suite.

Invariants checked: lines accumulate across runs and pool only with the current code digest, workload, harness and
machine class; a change
to any product source file changes the digest (so a stale series never pools with a new one: the negative control
edits one file); a malformed line is an error naming its line; the pairs-needed estimate follows 1/sqrt(pairs)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from perf import pairs_ledger as pl


def _rec(code: str, ratios, workload: str = "1K-c1", instance: str = "s-0") -> dict:
    """A line as the benchmark writes it: `code` is the served digest it pools by, `full` the whole tree's."""
    return {"served": code, "code": f"full-{code}", "workload": workload, "instance": instance,
            "ratios": list(ratios)}


def test_lines_accumulate_across_runs_and_pool_only_their_code_and_workload(tmp_path):
    path = tmp_path / "pairs.jsonl"
    pl.append(path, _rec("aaaa", [1.0, 1.02], instance="run1-0"))
    pl.append(path, _rec("aaaa", [0.99, 1.01], instance="run2-0"))   # a second run appends
    pl.append(path, _rec("bbbb", [1.5, 1.5]))                        # other code: kept, not pooled
    pl.append(path, _rec("aaaa", [2.0], workload="mixed-8"))          # other workload: ignored
    pl.append(path, dict(_rec("aaaa", [0.5]), harness="quiesce-1"))  # another timing harness: its own series
    groups, other = pl.load(path, code="aaaa", workload="1K-c1")
    assert groups == [[1.0, 1.02], [0.99, 1.01]] and other == 2
    assert pl.load(path, code="aaaa", workload="1K-c1", harness="quiesce-1") == ([[0.5]], 3)
    assert pl.pooled(path, code="aaaa", workload="1K-c1") == pl.interval(groups, other_code=other)
    out = pl.interval(groups, other_code=other)
    assert out["instances"] == 2 and out["pairs"] == 4 and out["other_code_lines"] == 2
    assert out["median_ratio"] == 1.005 and out["nested_ci95"][0] <= 1.005 <= out["nested_ci95"][1]


def test_a_record_without_its_fields_is_refused_and_writes_nothing(tmp_path):
    path = tmp_path / "pairs.jsonl"
    with pytest.raises(ValueError, match="lacks"):
        pl.append(path, {"code": "aaaa", "ratios": [1.0]})
    assert not path.exists()


def test_a_malformed_line_is_an_error_naming_its_line(tmp_path):
    path = tmp_path / "pairs.jsonl"
    pl.append(path, _rec("aaaa", [1.0]))
    with open(path, "a") as f:
        f.write('{"code": "aaaa", "ratios": [1.0\n')  # a line cut short (a run killed mid-write)
    with pytest.raises(ValueError, match=r"pairs.jsonl:2"):
        pl.load(path, code="aaaa", workload="1K-c1")


def test_the_digest_changes_with_any_product_source_file(tmp_path):
    src = tmp_path / "retire"
    (src / "adapter").mkdir(parents=True)
    (src / "engine.py").write_text("x = 1\n")
    (src / "adapter" / "a.py").write_text("y = 2\n")
    before = pl.code_digest(src)
    assert pl.code_digest(src) == before
    (src / "adapter" / "a.py").write_text("y = 3\n")  # negative control: one edited file must start a new series
    assert pl.code_digest(src) != before
    (src / "adapter" / "a.py").write_text("y = 2\n")
    assert pl.code_digest(src) == before


def test_pairs_needed_follows_one_over_sqrt_pairs():
    rng = np.random.default_rng(3)
    groups = [list(1.0 + off + rng.normal(0, 0.04, 6)) for off in rng.normal(0, 0.02, 16)]
    out = pl.interval(groups)
    assert out["width"] > pl.TARGET_WIDTH
    assert out["pairs_needed"] == round(96 * (out["width"] / pl.TARGET_WIDTH) ** 2)
    narrow = pl.interval([[1.0, 1.0001, 0.9999]] * 4)
    assert narrow["width"] < pl.TARGET_WIDTH and narrow["pairs_needed"] == narrow["pairs"]


def test_the_ledger_file_is_one_json_object_per_line(tmp_path):
    path = tmp_path / "pairs.jsonl"
    pl.append(path, _rec("aaaa", [1.0]))
    pl.append(path, _rec("aaaa", [1.1], instance="s-1"))
    assert [json.loads(x)["instance"] for x in path.read_text().splitlines()] == ["s-0", "s-1"]


def test_pairs_of_another_machine_class_never_pool(tmp_path):
    path = tmp_path / "pairs.jsonl"
    here = pl.host_class()
    pl.append(path, dict(_rec("aaaa", [1.0, 1.01]), host=here))
    pl.append(path, dict(_rec("aaaa", [1.5, 1.6], instance="s-1"), host="Other CPU | amx+avx512 | 2 cpu"))
    pl.append(path, _rec("aaaa", [1.3], instance="s-2"))  # a line from before the machine class was recorded
    assert pl.load(path, code="aaaa", workload="1K-c1", host=here) == ([[1.0, 1.01]], 2)
    assert pl.load(path, code="aaaa", workload="1K-c1") == ([[1.3]], 2)  # only the unlabelled line


def test_the_machine_class_names_the_cpu_and_its_bf16_features():
    import os

    import torch

    a = pl.host_class()
    assert a == pl.host_class() and a.endswith(f"| {os.cpu_count()} cpu")
    assert ("amx" in a) == torch.cpu._is_amx_tile_supported()
    assert ("avx512_bf16" in a) == torch.cpu._is_avx512_bf16_supported()


def test_the_cpu_id_names_the_first_cpu_and_its_l2(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                    "stepping\t: 1\n\nprocessor\t: 1\nvendor_id\t: Other\ncpu family\t: 6\n")
    (tmp_path / "l2").write_text("1024K\n")
    assert pl.cpu_id(str(info), str(tmp_path / "l2")) == "AuthenticAMD family 25 model 17 stepping 1 | L2 1024K"
    # what it cannot read is "?", never an exception (a ledger line must still be written)
    assert pl.cpu_id(str(tmp_path / "none"), str(tmp_path / "none")) == "? family ? model ? stepping ? | L2 ?"


def test_by_cpu_breaks_the_pool_down_without_filtering_it(tmp_path):
    path = tmp_path / "pairs.jsonl"
    pl.append(path, dict(_rec("aaaa", [1.0, 1.02]), cpu="zen4"))
    pl.append(path, dict(_rec("aaaa", [1.04, 1.06], instance="s-1"), cpu="zen5"))
    pl.append(path, dict(_rec("aaaa", [1.08], instance="s-2"), cpu="zen5"))
    pl.append(path, _rec("aaaa", [0.9], instance="s-3"))  # written before `cpu` was recorded
    pl.append(path, dict(_rec("bbbb", [1.5], instance="s-4"), cpu="zen4"))  # other code: in neither
    split = pl.by_cpu(pl._records(path, code="aaaa", workload="1K-c1", harness="", host=None, mapping=None)[0])
    assert {k: (v["instances"], v["pairs"], v["median_ratio"]) for k, v in split.items()} == \
        {"zen4": (1, 2, 1.01), "zen5": (2, 3, 1.06), "unrecorded": (1, 1, 0.9)}
    assert pl.load(path, code="aaaa", workload="1K-c1")[0] == [[1.0, 1.02], [1.04, 1.06], [1.08], [0.9]]


def test_a_line_without_a_served_digest_pools_through_the_code_map_only(tmp_path):
    path = tmp_path / "pairs.jsonl"
    pl.append(path, {"code": "old-full", "workload": "1K-c1", "instance": "old-0", "ratios": [1.1]})
    pl.append(path, _rec("srv", [1.0]))
    assert pl.load(path, code="srv", workload="1K-c1", mapping={"old-full": "srv"}) == ([[1.1], [1.0]], 0)
    # negative control: without the entry (or with an entry naming other code) the old line is another series
    assert pl.load(path, code="srv", workload="1K-c1", mapping={}) == ([[1.0]], 1)
    assert pl.load(path, code="srv", workload="1K-c1", mapping={"old-full": "else"}) == ([[1.0]], 1)


def _commit_all(repo, msg: str) -> str:
    import subprocess

    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", msg], check=True, capture_output=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def test_the_code_map_is_computed_from_each_commit_and_refuses_a_conflict(tmp_path):
    import shutil
    import subprocess

    repo = tmp_path / "repo"
    (repo / "retire").mkdir(parents=True)
    (repo / "perf").mkdir()
    (repo / "retire" / "__init__.py").write_text("from . import engine\n")
    (repo / "retire" / "engine.py").write_text("x = 1\n")
    (repo / "retire" / "replay.py").write_text("y = 1\n")  # nothing the harness reaches imports it
    (repo / "perf" / "test_bench_overhead.py").write_text("import retire\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    first = _commit_all(repo, "one")
    (repo / "retire" / "replay.py").write_text("y = 2\n")
    second = _commit_all(repo, "an edit outside the served closure")
    path = tmp_path / "map.json"
    entries = pl.map_commits([first, second], path=path, repo=repo)
    assert len(entries) == 2 and len({e["served"] for e in entries.values()}) == 1  # two trees, one served code
    work = tmp_path / "work"
    shutil.copytree(repo, work)
    (work / "retire" / "replay.py").write_text("y = 1\n")
    assert pl.code_digest(work / "retire") in entries  # the key is the full digest the old lines carry
    (repo / "retire" / "engine.py").write_text("x = 2\n")
    third = _commit_all(repo, "an edit inside it")
    assert len({e["served"] for e in pl.map_commits([third], path=path, repo=repo).values()}) == 2
    # negative control: an entry that disagrees with the commit's own tree is refused and the file is unchanged
    bad = json.loads(path.read_text())
    bad[next(k for k, e in bad.items() if e["commit"] == first[:12])]["served"] = "0" * 16
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="mapped to served"):
        pl.map_commits([first], path=path, repo=repo)
    assert json.loads(path.read_text()) == bad


def test_the_committed_code_map_matches_its_commits():
    """Each entry of results/no-revision-code-map.json, recomputed from its commit, gives the same two digests."""
    import subprocess
    import tempfile

    entries = json.loads(pl.CODE_MAP.read_text())
    for e in entries.values():
        have = subprocess.run(["git", "-C", str(pl.CODE_MAP.parent.parent), "cat-file", "-e",
                               f"{e['commit']}^{{commit}}"], capture_output=True)
        if have.returncode:
            pytest.skip(f"commit {e['commit']} is not in this clone (shallow?): the map cannot be recomputed here")

    with tempfile.TemporaryDirectory() as tmp:
        again = pl.map_commits([e["commit"] for e in entries.values()], path=f"{tmp}/m.json")
    assert again == entries


def test_status_pools_this_checkout_and_machine_without_an_engine(tmp_path):
    path = tmp_path / "pairs.jsonl"
    here, code = pl.host_class(), pl.served_digest()
    pl.append(path, dict(_rec(code, [1.0, 1.02]), host=here, harness="h"))
    pl.append(path, dict(_rec(code, [0.98, 1.0], instance="s-1"), host=here, harness="h"))
    pl.append(path, dict(_rec(code, [1.5], instance="s-2"), host=here, harness="other"))
    out = pl.status(path, "1K-c1", "h")
    assert (out["served"], out["host"], out["instances"], out["pairs"], out["other_code_lines"]) == \
        (code, here, 2, 4, 1)
    assert {k: v["instances"] for k, v in out["by_cpu"].items()} == {"unrecorded": 2}


def test_the_geometric_mean_interval_is_reported_next_to_the_median_and_is_narrower_on_a_symmetric_spread():
    rng = np.random.default_rng(5)
    groups = [list(np.exp(rng.normal(np.log(1.02), 0.1, 24))) for _ in range(20)]
    out = pl.interval(groups)
    lo, hi = out["geo_nested_ci95"]
    assert lo < 1.02 < hi and out["geo_width"] == round(hi - lo, 4)
    assert out["geo_width"] < out["width"]  # the mean's efficiency on a normal spread of log ratios
    # negative control: a shifted series moves the interval off the true centre
    shifted = pl.interval([[x * 1.1 for x in g] for g in groups])
    assert shifted["geo_nested_ci95"][0] > 1.02
