"""The mutation score of `make mutate`, read from mutmut's own result files (mutants/**/*.py.meta).

    python -m conformance.mutation_report [--survivors] [--min-score 90] [--documented docs/mutation.md] [--out F]

Prints one row per mutated module (total, killed, survived, timeout, suspicious, no tests, score), the primary
modules (the transition core, ALIGN, the ledger, the frontend authority, the engine's version table), the others
and all of them, then with `--survivors` every surviving mutant as `file:line  mutant  -original / +mutated`.
Score = (killed + timeout) / total: a mutant that makes the suite hang is detected (mutmut stops it at its time
limit; the suite's own pytest-timeout would fail it too). `--min-score` exits 1 if the primary modules' combined
score is below it; `--documented FILE` exits 1 if a survivor is not classified in FILE: named in a table row whose
verdict lets it survive (equivalent, accepted, not exercised, caught by a crash, killed outside mutmut; see
`classified`), so a new one, or one a test was said to kill, fails `make mutate` until it is killed or explained;
it also notes, without failing, a row whose line no longer matches its mutant's (`stale_locations`).
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import tomllib
from collections import Counter
from pathlib import Path

PRIMARY = ("retire/transition.py", "retire/align.py", "retire/ledger.py", "retire/authority.py", "retire/versions.py")
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 36: "timeout",
          -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", None: "not checked"}
COLUMNS = ("total", "killed", "survived", "timeout", "suspicious", "no tests", "not checked")


def status(code) -> str:
    return STATUS.get(code, "suspicious")


def results(root: Path = Path(".")) -> dict[str, dict[str, int | None]]:
    """module path -> {mutant name: exit code} for every module mutmut was configured to mutate."""
    cfg = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]
    out = {}
    for path in cfg["only_mutate"]:
        meta = root / "mutants" / f"{path}.meta"
        out[path] = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
    return out


def row(codes: dict) -> Counter:
    c = Counter(status(v) for v in codes.values())
    c["total"] = len(codes)
    return c


def score(c: Counter) -> float:
    return 100.0 * (c["killed"] + c["timeout"]) / c["total"] if c["total"] else 0.0


def table(res: dict) -> tuple[str, float]:
    head = "| module | " + " | ".join(COLUMNS) + " | score |"
    lines = [head, "|" + " --- |" * (len(COLUMNS) + 2)]
    primary_total, overall = Counter(), Counter()
    for group, members in (("primary", PRIMARY), ("other", [p for p in res if p not in PRIMARY])):
        total = Counter()
        for path in members:
            c = row(res.get(path, {}))
            total.update(c)
            lines.append(f"| `{path}` | " + " | ".join(str(c[k]) for k in COLUMNS) + f" | {score(c):.1f}% |")
        if members:
            lines.append(f"| **{group} modules** | " + " | ".join(f"**{total[k]}**" for k in COLUMNS)
                         + f" | **{score(total):.1f}%** |")
        if group == "primary":
            primary_total = total
        overall.update(total)
    lines.append("| **all modules** | " + " | ".join(f"**{overall[k]}**" for k in COLUMNS)
                 + f" | **{score(overall):.1f}%** |")
    return "\n".join(lines), score(primary_total)


def _function_span(tree: ast.Module, name: str, cls: str | None) -> tuple[int, int]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and cls and node.name == cls:
            for f in node.body:
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == name:
                    return f.lineno, f.end_lineno
        if not cls and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node.lineno, node.end_lineno
    return 1, 10 ** 9


def short_name(name: str) -> str:
    """`Class.method__mutmut_N` or `function__mutmut_N` (the mutant's name without module and mangling)."""
    last = name.rpartition(".")[2]
    if last.startswith("xǁ"):  # a method: xǁClassǁmethod (a class name may itself end in "x")
        cls, _, rest = last[2:].partition("ǁ")
        return f"{cls}.{rest}"
    return last[2:] if last.startswith("x_") else last


#: a row's verdict that lets its mutant survive; "missing test, added" and "killed after …" rows name mutants that a
#: test kills, so if one survives again the run fails
STANDING = ("equivalent", "accepted", "**not exercised", "not exercised", "caught by a crash", "killed outside mutmut")


def _table_rows(text: str):
    """(columns, mutant names) of every classification table row of `text`: `| location | mutant(s) | mutation |
    verdict | why |`, the names being the backticked `…__mutmut_N` in the second column."""
    for line in text.splitlines():
        if line.startswith("|"):
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cols) >= 5:
                yield cols, re.findall(r"`([^`\s]+__mutmut_\d+)`", cols[1])


def classified(text: str) -> set[str]:
    """Mutant names (`Class.method__mutmut_N`) that a classification table row of `text` lets survive: its verdict
    starts with one of STANDING. A name met only in prose, or in a row whose verdict says a test kills it, is not
    classified."""
    return {n for cols, names in _table_rows(text) if cols[3].startswith(STANDING) for n in names}


def undocumented(res: dict, doc: Path) -> list[str]:
    known = classified(doc.read_text())
    return [f"{path}: {short_name(n)}" for path, codes in res.items() for n, c in codes.items()
            if status(c) in ("survived", "no tests", "suspicious") and short_name(n) not in known]


def survivor_rows(res: dict) -> list[tuple[str, int, str, str, list[str], list[str]]]:
    """(path, line, short name, status, original lines, mutated lines) for every survivor, read with mutmut's own
    diff of the generated functions; the line is the first original line's in the function, else the function's."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key

    out = []
    for path, codes in res.items():
        src = Path(path).read_text().splitlines()
        tree = ast.parse("\n".join(src))
        for name, code in sorted(codes.items(), key=lambda kv: _order(kv[0])):
            if status(code) not in ("survived", "no tests", "suspicious"):
                continue
            diff = get_diff_for_mutant(name, path=path).splitlines()
            minus = [d[1:] for d in diff if d.startswith("-") and not d.startswith("---")]
            plus = [d[1:] for d in diff if d.startswith("+") and not d.startswith("+++")]
            fn, cls = orig_function_and_class_names_from_key(name)
            lo, hi = _function_span(tree, fn.rpartition(".")[2], cls)
            first = minus[0].strip() if minus else None
            line = next((i + 1 for i in range(lo - 1, min(hi, len(src))) if src[i].strip() == first), lo)
            out.append((path, line, short_name(name), status(code), minus, plus))
    return out


def _format(row) -> str:
    path, line, name, st, minus, plus = row
    return (f"{path}:{line}  {name}  [{st}]\n    - {' / '.join(m.strip() for m in minus)}\n"
            f"    + {' / '.join(p.strip() for p in plus)}")


def _row_lines(location: str) -> tuple[str, set[int]]:
    """`mailbox.py:171–174` or `slicing.py:300, 302` -> ("mailbox.py", {171, ..., 174})."""
    file, _, spec = location.partition(":")
    lines: set[int] = set()
    for a, b in re.findall(r"(\d+)(?:\s*[–-]\s*(\d+))?", spec):
        lines.update(range(int(a), int(b or a) + 1))
    return file.strip(), lines


def stale_locations(found: list[tuple[str, int, str]], text: str) -> list[str]:
    """Survivors (path, line, short name) whose classification rows in `text` all give another file or line: the
    row was written for an older version of the module (mutmut renumbers a function's mutants when it changes, so a
    stale row may describe another mutation). Reported by `--documented`, not failed on."""
    where: dict[str, list[str]] = {}
    for cols, names in _table_rows(text):
        for n in names:
            where.setdefault(n, []).append(cols[0])
    out = []
    for path, line, name in found:
        rows = [_row_lines(loc) for loc in where.get(name, [])]
        if rows and not any((path == f or path.endswith("/" + f)) and line in ls for f, ls in rows):
            out.append(f"{path}:{line}: {name} (row: {', '.join(where[name])})")
    return out


def _order(name: str):
    base, _, n = name.rpartition("__mutmut_")
    return base, int(n) if n.isdigit() else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--survivors", action="store_true", help="list every surviving mutant with its diff")
    ap.add_argument("--min-score", type=float, default=None, help="fail if the primary modules score below this")
    ap.add_argument("--documented", type=Path, default=None, help="fail if a survivor is not classified in this file")
    ap.add_argument("--out", type=Path, default=None, help="also write the table (and survivors) to this file")
    a = ap.parse_args(argv)
    res = results()
    text, primary = table(res)
    rows = survivor_rows(res) if a.survivors or a.documented is not None else []
    if a.survivors:
        text += "\n\n" + "\n".join(_format(r) for r in rows)
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")
    rc = 0
    if a.min_score is not None and primary < a.min_score:
        print(f"\nprimary modules score {primary:.1f}% < {a.min_score}%", file=sys.stderr)
        rc = 1
    if a.documented is not None:
        missing = undocumented(res, a.documented)
        if missing:
            print(f"\n{len(missing)} survivor(s) not classified in {a.documented}:\n  " + "\n  ".join(missing),
                  file=sys.stderr)
            rc = 1
        stale = stale_locations([r[:3] for r in rows], a.documented.read_text())
        if stale:
            print(f"\nnote: {len(stale)} classification row(s) in {a.documented} give another line than the mutant's "
                  f"(update the row after checking it still describes the mutation):\n  " + "\n  ".join(stale),
                  file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
