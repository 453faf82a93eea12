"""`retire compat FILE...`: the compatibility tables (guarantee x vLLM version, seam status x version) from verdict
JSONs (`retire conform`) and seam reports (`retire seams --json`).

Invariant: a cell shows exactly what its file says (`true` / `false` / `unknown`, a seam's status); a version's
column never borrows another's verdict, and a guarantee absent from a file is shown as `-`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _version(doc: dict, path: str) -> str:
    v = (doc.get("vllm") or {}).get("version") or (doc.get("machine") or {}).get("vllm")
    return str(v or Path(path).stem)


def _columns(docs: list[tuple[str, dict]]) -> list[str]:
    """One label per file: its vLLM version, with the file name where two files share a version."""
    cols = [_version(d, p) for p, d in docs]
    return [f"{c} ({Path(p).stem})" if cols.count(c) > 1 else c for c, (p, _) in zip(cols, docs)]


def verdict_table(docs: list[tuple[str, dict]]) -> str:
    cols = _columns(docs)
    rows: dict[str, dict[str, str]] = {}
    for (p, d), col in zip(docs, cols):
        for name, v in d.get("verdicts", {}).items():
            cell = v.get("verdict") or {True: "true", False: "false", None: "unknown"}[v.get("valid")]
            if cell == "true":
                cell = f"true ({v.get('passed', 0)})"
            rows.setdefault(name, {})[col] = cell
    out = ["| guarantee | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for name, cells in rows.items():
        out.append(f"| {name} | " + " | ".join(cells.get(c, "-") for c in cols) + " |")
    walls = [f"{(d.get('wall_s') or {}).get('total', '?')} s" for _, d in docs]
    out.append("| *wall time (total)* | " + " | ".join(walls) + " |")
    return "\n".join(out)


def seam_table(docs: list[tuple[str, dict]]) -> str:
    cols = _columns(docs)
    rows: dict[str, dict[str, str]] = {}
    for (p, d), col in zip(docs, cols):
        for s in d.get("seams", []):
            rows.setdefault(s["where"], {})[col] = s["status"] + (f" -> {s['found']}" if s["status"] == "moved" else "")
    failing = {w: c for w, c in rows.items() if any(v != "present" for v in c.values())}
    out = ["| seam | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    counts = [f"{sum(s['status'] == 'present' for s in d.get('seams', []))}/{len(d.get('seams', []))}"
              for _, d in docs]
    out.append("| *present* | " + " | ".join(counts) + " |")
    for where, cells in failing.items():
        out.append(f"| `{where}` | " + " | ".join(cells.get(c, "-") for c in cols) + " |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    docs = [(p, json.loads(Path(p).read_text())) for p in argv]
    verdict_docs = [x for x in docs if x[1].get("kind") == "retire-conformance"]
    seam_docs = [x for x in docs if x[1].get("kind") == "retire-seams"]
    seam_docs += [(p, d["seams"]) for p, d in verdict_docs if isinstance(d.get("seams"), dict)
                  and d["seams"].get("kind") == "retire-seams" and not seam_docs]
    if verdict_docs:
        print(verdict_table(verdict_docs) + "\n")
    if seam_docs:
        print(seam_table(seam_docs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
