"""Layering, engine-free: what the packaged product may import (read from the source with `ast`, nothing imported).

Rules:
1. Nothing packaged (`retire/`, `oracles/`, the packages pyproject ships) imports the unpackaged testbed
   (`conformance`, `perf`): an installed `retire` must work without them.
2. The control plane imports nothing from `oracles/`, nor anything from the parts of `retire` that may (the demo, the
   faults, the traces, the shared trial helpers, and the console dispatcher that starts them), so not even
   transitively. The control plane is every module of `retire/` outside TESTBED_SIDE.
Every import statement counts, at module level or inside a function (a lazy import is still a dependency), and so does
`importlib.import_module("...")` / `__import__("...")` with a constant name. Relative imports are resolved.

Negative control: the checker reports a synthetic package that breaks each rule, naming file, line and module.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGED = ("retire", "oracles")
TESTBED = ("conformance", "perf")
TESTBED_SIDE = ("retire.demo", "retire.faults", "retire.traces", "retire.trials", "retire.cli")


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(current: str, is_pkg: bool, level: int, module: str | None) -> str:
    base = current.split(".") if is_pkg else current.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def imports(root: Path, path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in `path`, a module of the tree rooted at `root`."""
    name = _module_name(root, path)
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve(name, is_pkg, node.level, node.module) if node.level else node.module or ""
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if fname in ("import_module", "__import__"):
                out.append((node.lineno, node.args[0].value))
    return out


def _under(mod: str, prefixes) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def violations(root: Path, packaged=PACKAGED, testbed=TESTBED, testbed_side=TESTBED_SIDE) -> list[str]:
    """One line per (import statement, broken rule), naming the file, the line and the imported module."""
    out: dict[tuple[str, str], str] = {}
    for pkg in packaged:
        for path in sorted((root / pkg).rglob("*.py")):
            name = _module_name(root, path)
            control_plane = _under(name, ("retire",)) and not _under(name, testbed_side)
            for line, mod in imports(root, path):
                where = f"{path.relative_to(root)}:{line}"
                if _under(mod, testbed):
                    out.setdefault((where, "testbed"),
                                   f"{where}: packaged module {name} imports the unpackaged testbed ({mod})")
                if control_plane and _under(mod, ("oracles",)):
                    out.setdefault((where, "oracles"), f"{where}: control-plane module {name} imports {mod}")
                if control_plane and _under(mod, testbed_side):
                    out.setdefault((where, "side"),
                                   f"{where}: control-plane module {name} imports {mod}, which may import oracles")
    return list(out.values())


def test_packaged_code_never_imports_the_testbed_and_the_control_plane_never_imports_oracles():
    found = violations(ROOT)
    assert not found, "layering violations:\n" + "\n".join(found)
    # the rule is about real code: the control plane is not empty and the checker sees its imports
    assert len(imports(ROOT, ROOT / "retire" / "engine.py")) >= 5


def test_negative_control_synthetic_violations_are_reported(tmp_path):
    retire = tmp_path / "retire"
    (retire / "faults").mkdir(parents=True)
    (tmp_path / "oracles").mkdir()
    (retire / "__init__.py").write_text("")
    (retire / "faults" / "__init__.py").write_text("from oracles import collect  # allowed: faults may use oracles\n")
    (retire / "core.py").write_text(
        "import os\n"
        "from . import faults\n"                                  # control plane -> testbed side
        "def f():\n"
        "    from conformance.fixtures.prompts import tokens\n"  # lazy import of the testbed
        "    import importlib\n"
        "    return importlib.import_module('perf.common')\n")   # dynamic import of the testbed
    (retire / "engine2.py").write_text("from oracles.runs import collect\n")  # control plane -> oracles
    (tmp_path / "oracles" / "__init__.py").write_text("from ..conformance import scenarios\n")
    found = violations(tmp_path)
    text = "\n".join(found)
    assert "retire/core.py:2: control-plane module retire.core imports retire.faults" in text, text
    assert "retire/core.py:4: packaged module retire.core imports the unpackaged testbed (conformance" in text, text
    assert "retire/core.py:6: packaged module retire.core imports the unpackaged testbed (perf.common)" in text, text
    assert "retire/engine2.py:1: control-plane module retire.engine2 imports oracles.runs" in text, text
    assert not any("retire/faults/__init__.py" in f for f in found), "the faults may import oracles"
    assert any(f.startswith("oracles/__init__.py:1") for f in found), text  # oracles is packaged too
