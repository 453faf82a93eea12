"""The served closure (perf/served_code.py), engine-free: which `retire` modules the no-revision digest covers.

Invariants checked on a synthetic tree: every import form the rules name reaches its module (absolute, relative,
inside a function, a string naming a class, a dynamic import of the package's own subtree or of an f-string prefix,
the vLLM plugin entry point); a module nothing reaches stays out, so editing it keeps the digest (and editing a
reached one changes it: the negative control); an unreviewed dynamic import is an error. On the real tree: the
scheduler and worker extension vLLM is handed by name are in, the replay driver and the HTTP server are out, and
every `retire` module the harness actually imports in this process is in (the static closure over-approximates)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from perf import served_code as sc


def _tree(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


BASE = {
    "perf/test_bench_overhead.py": "from retire.trials import shapes\nimport conformance.fixtures.engines\n",
    "conformance/__init__.py": "", "conformance/fixtures/__init__.py": "",
    "conformance/fixtures/engines.py": "def start():\n    from retire import engine\n",
    "conformance/fixtures/servers.py": "CMD = 'retire.cli'\n",  # nothing the harness reaches imports it
    "pyproject.toml": '[project.entry-points."vllm.general_plugins"]\nretire = "retire.plugin:register"\n',
    "retire/__init__.py": "", "retire/plugin.py": "from . import adapter\n",
    "retire/adapter/__init__.py": "import importlib\ndef load(v):\n    return importlib.import_module(f'{__name__}.e{v}')\n",
    "retire/adapter/e1.py": "", "retire/adapter/e2.py": "",
    "retire/trials/__init__.py": "", "retire/trials/shapes.py": "from ..backend import X\n",
    "retire/backend.py": "X = 1\nSCHED = 'retire.scheduler.RetireScheduler'\n",
    "retire/scheduler.py": "from . import table\n",
    "retire/table.py": "import importlib\ndef t(v):\n    return importlib.import_module(f'retire.tables.t{v}')\n",
    "retire/tables/__init__.py": "", "retire/tables/t1.py": "", "retire/tables/other.py": "",
    "retire/engine.py": "", "retire/cli.py": "from . import replay\n", "retire/replay.py": "",
}


def test_every_import_form_is_followed_and_unreached_modules_stay_out(tmp_path):
    _tree(tmp_path, BASE)
    assert sc.closure(tmp_path) == sorted([
        "retire", "retire.plugin", "retire.adapter", "retire.adapter.e1", "retire.adapter.e2",  # entry point, own
        "retire.trials", "retire.trials.shapes", "retire.backend",  # absolute, relative (package __init__ too)
        "retire.scheduler", "retire.table", "retire.tables", "retire.tables.t1",  # by name; f-string prefix
        "retire.engine"])  # an import inside a function counts
    # retire.cli and retire.replay are only named by a fixture the harness does not import


def test_the_digest_follows_reached_modules_only(tmp_path):
    _tree(tmp_path, BASE)
    before = sc.served_digest(tmp_path, versions="v")
    (tmp_path / "retire" / "replay.py").write_text("y = 2\n")
    assert sc.served_digest(tmp_path, versions="v") == before
    (tmp_path / "retire" / "tables" / "t1.py").write_text("z = 1\n")  # negative control: a reached module
    assert sc.served_digest(tmp_path, versions="v") != before
    assert sc.served_digest(tmp_path, versions="w") != sc.served_digest(tmp_path, versions="v")


def test_a_dynamic_import_the_closure_cannot_follow_is_an_error(tmp_path):
    _tree(tmp_path, {**BASE, "retire/engine.py": "import importlib\ndef f(m):\n    return importlib.import_module(m)\n"})
    with pytest.raises(ValueError, match="retire/engine.py: a dynamic import"):
        sc.closure(tmp_path)


def test_the_real_closure_holds_what_vllm_is_handed_by_name_and_not_the_replay_or_server():
    names = set(sc.closure())
    assert {"retire.scheduler", "retire.worker_ext", "retire.plugin", "retire.engine", "retire.backend",
            "retire.adapter.engine_0_32", "retire.adapter.worker_0_32", "retire.trials.shapes"} <= names
    assert not names & {"retire.traces.driver", "retire.serve.app", "retire.report", "retire.cli"}


def test_the_closure_covers_every_retire_module_the_harness_imports():
    """Runtime cross-check in a fresh interpreter: import the benchmark module (which imports its fixtures, oracles
    and `retire`), build the engine's classes the way vLLM does (by name), and list the `retire` modules loaded."""
    code = textwrap.dedent("""
        import sys, importlib
        import conftest, perf.conftest, perf.test_bench_overhead
        from retire.backend import SCHEDULER_CLS, WORKER_EXT_CLS
        from retire.plugin import register
        import retire
        retire.RetireEngine
        for q in (SCHEDULER_CLS, WORKER_EXT_CLS):
            m, _, a = q.rpartition('.')
            getattr(importlib.import_module(m), a)
        register()
        print('\\n'.join(sorted(m for m in sys.modules if m == 'retire' or m.startswith('retire.'))))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=sc.ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = set(out.stdout.split())
    assert "retire.scheduler" in loaded and "retire.worker_ext" in loaded
    assert loaded <= set(sc.closure()), sorted(loaded - set(sc.closure()))
