"""The product code a no-revision measurement runs: the static import closure of `retire` from the benchmark harness.

Why: the ledger (perf/pairs_ledger.py) pools pairs only of the code they measured. Digesting every `retire/**/*.py`
starts a new series at any edit, even to a module no measured process ever imports (a replay driver, the HTTP
server, the report), and the series so far have each been cut short by such an edit. This digest covers the modules
the measurement can execute, and nothing else.

Invariant: `closure(root)` contains every `retire` module that any of the harness files (`HARNESS`) or vLLM's plugin
entry points (pyproject `vllm.general_plugins`, loaded in EVERY vLLM process, stock ones included) can import, by
these rules, applied transitively:
- `import a.b.c` and `from a.b import c` reach `a`, `a.b`, `a.b.c` (a package's `__init__` runs on any import below
  it) and, for `from`, the submodule `a.b.c` when it exists; relative imports resolve against the module's package;
- every import anywhere in a module counts, including imports inside functions, whether or not that path runs;
- a string constant naming a module or an attribute of one (`"retire.scheduler.RetireScheduler"`, how vLLM is
  given `scheduler_cls` and `worker_extension_cls`) reaches that module;
- a dynamic import (`importlib.import_module` or `__import__` of a non-constant) reaches every module below the
  importing module's own package when its argument is built from `__name__`, and every module whose name starts with
  the constant start of an f-string argument (`f"retire.adapter.table{v}"`); any other dynamic import in the closure
  is an error unless `DYNAMIC_OUTSIDE` names it, with the reason its targets lie outside `retire`.
So the closure can only over-approximate what runs: a module outside it cannot be imported by the measured path.
"""
from __future__ import annotations

import ast
import hashlib
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "retire"
# the no-revision benchmark module and the conftest files pytest loads with it; the closure follows their imports
# through the testbed's packages (FOLLOWED) to the `retire` modules it digests
HARNESS = ("perf/test_bench_overhead.py", "perf/conftest.py", "conftest.py")
FOLLOWED = (PACKAGE, "perf", "conformance", "oracles")
# this module names `retire` modules as data (DYNAMIC_OUTSIDE), never to import them
NOT_FOLLOWED = {"perf.served_code"}
# reviewed dynamic imports whose targets are not `retire` modules
DYNAMIC_OUTSIDE = {
    "retire.plugin": "imports the vLLM modules named by the adapter's seam table (s.module), to check the seams",
    "retire.serve.app": "imports the vLLM modules of the HTTP server's seams, to check them",
    "retire.conform": "reads __version__ of vLLM, torch and the other packages it reports",
}
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def module_file(root: Path, name: str) -> Path | None:
    """The source file of module `name` under `root` (a package's `__init__.py`), or None."""
    p = root.joinpath(*name.split("."))
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    if p.with_suffix(".py").is_file():
        return p.with_suffix(".py")
    return None


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts) + 1)]


def _is_dynamic(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or not node.args or isinstance(node.args[0], ast.Constant):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id in ("__import__", "import_module"))


def _uses_own_name(node: ast.Call) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(node.args[0]))


def _constant_prefix(node: ast.Call) -> str:
    """The constant start of an f-string argument (`f"retire.adapter.table{v}"` -> "retire.adapter.table"), or ""."""
    arg = node.args[0]
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value)
    return ""


def references(path: Path, name: str) -> tuple[set[str], bool, bool]:
    """(dotted names the module at `path` may import, whether it imports its own subtree dynamically, whether it has
    another dynamic import). A dynamic import of an f-string with a constant dotted start reaches the names that
    start with it, recorded as `prefix*`."""
    tree = ast.parse(path.read_text(), str(path))
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    refs: set[str] = set()
    own = other = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            refs.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            refs.add(mod)
            refs.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.fullmatch(node.value):
            refs.add(node.value)
        elif _is_dynamic(node):
            if _uses_own_name(node):
                own = True
            elif "." in (start := _constant_prefix(node)):
                refs.add(start + "*")
            else:
                other = True
    return refs, own, other


def module_name(root: Path, f: Path) -> str:
    """The dotted name of source file `f` under `root` (a package's `__init__.py` is the package)."""
    parts = f.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules_below(root: Path, base: Path) -> list[str]:
    return [module_name(root, f) for f in base.rglob("*.py")]


def _starting_with(root: Path, start: str) -> list[str]:
    pkg = root.joinpath(*start.rpartition(".")[0].split("."))
    return [m for m in _modules_below(root, pkg) if m.startswith(start)] if pkg.is_dir() else []


def _harness_files(root: Path) -> list[Path]:
    return sorted({p for pattern in HARNESS for p in root.glob(pattern) if p.is_file()})


def plugin_entries(root: Path) -> list[str]:
    """Modules of pyproject's `vllm.general_plugins` entry points (`module:function`)."""
    py = root / "pyproject.toml"
    if not py.is_file():
        return []
    eps = tomllib.loads(py.read_text()).get("project", {}).get("entry-points", {})
    return sorted(v.split(":")[0] for v in eps.get("vllm.general_plugins", {}).values())


def closure(root: Path = ROOT) -> list[str]:
    """Sorted names of every `retire` module the harness and the plugin entry points can reach (rules above)."""
    return sorted(n for n in reach(root) if n.split(".")[0] == PACKAGE)


def reach(root: Path = ROOT) -> set[str]:
    """Every module of the FOLLOWED packages that the harness files and the plugin entry points can reach."""
    todo: list[str] = list(plugin_entries(root))
    for p in _harness_files(root):
        todo.extend(references(p, module_name(root, p))[0])
    seen: set[str] = set()
    while todo:
        ref = todo.pop()
        if ref.endswith("*"):  # every module named ref* in its package
            todo.extend(_starting_with(root, ref[:-1]))
            continue
        for name in _prefixes(ref):
            if name.split(".")[0] not in FOLLOWED or name in seen or name in NOT_FOLLOWED:
                continue
            if (path := module_file(root, name)) is None:
                continue
            seen.add(name)
            refs, own, other = references(path, name)
            todo.extend(refs)
            if own:
                todo.extend(_modules_below(root, path.parent))
            if other and name not in DYNAMIC_OUTSIDE:
                raise ValueError(f"{path.relative_to(root)}: a dynamic import the closure cannot follow; make it "
                                 f"constant, or name the module in perf/served_code.py DYNAMIC_OUTSIDE with the "
                                 f"reason its targets lie outside {PACKAGE}")
    return seen


def engine_versions() -> str:
    import torch
    import vllm

    return f"vllm {vllm.__version__} torch {torch.__version__}"


def files_digest(header: str, base: Path, files: list[Path]) -> str:
    """16 hex digits over `header` and each file's path relative to `base` and bytes, in the order given. Both
    ledger digests use it; the full one (pairs_ledger.code_digest) must stay byte-for-byte what old lines carry."""
    h = hashlib.sha256(f"{header}\n".encode())
    for p in files:
        h.update(str(p.relative_to(base)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def served_digest(root: Path = ROOT, versions: str | None = None) -> str:
    """16 hex digits over the closure's files (path and bytes, sorted) and the vLLM and torch versions."""
    return files_digest(f"served {versions or engine_versions()}", root,
                        [module_file(root, name) for name in closure(root)])
