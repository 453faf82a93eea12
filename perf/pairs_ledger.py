"""A resumable ledger of fresh-instance paired rounds, for the no-revision cost's nested interval (issue 14 section 5).

A 2%-wide nested 95% interval of retire/stock needs far more fresh engine pairs than one `make bench` can start (about
1,400 pairs by 1/sqrt(pairs) from the reference run's 16 instances). `make no-revision-ci` therefore appends every
finished instance pair to `results/no-revision-pairs.jsonl` and computes the interval over the whole ledger, so the
pairs accumulate across runs and sessions.

Invariants:
- One JSON line per finished instance pair, appended and flushed when its last round ends: an interrupted run keeps
  every instance it finished and loses at most the one it was in.
- Each line names the code it measured (`served`: the digest of the `retire` modules the measurement can import,
  perf/served_code.py, with the vLLM and torch versions; `code`: the digest of all of `retire/`), the workload, the
  timing harness and the machine class (`host_class`: CPU model, the ISA features that pick vLLM's CPU kernels, CPU
  count). Only lines of the CURRENT served digest, the requested workload, the same harness and the same machine
  class are pooled; any change to a measured module, the engine, the harness or the machine starts a new series (the
  old lines stay in the file, counted as `other_code_lines`). An edit to a module the measurement cannot import
  (the replay driver, the HTTP server) does not.
- A line written before the served digest existed carries only `code`; it pools through `CODE_MAP`
  (results/no-revision-code-map.json), whose entries `map_commits` computes from the commit's own tree: its full
  digest, recomputed, must equal the line's `code`, so an entry cannot attach a line to code it did not measure.
- Machine classes differ by several times in bf16 speed (emulated without AVX512-BF16/AMX), so a fixed per-step cost
  is a different fraction of a request on each: their pairs never pool.
- A machine class can span microarchitectures (the EPYC class held Zen 4 and Zen 5 hosts on the same day), so each
  line also records `cpu` (vendor, family, model, stepping, L2 per core). It does not split the pool; `status` shows
  the pooled lines broken down by it (`by_cpu`), lines written before it existed under "unrecorded".
- A line that is not a well-formed record is an error naming its line number, never skipped silently.
"""
from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import numpy as np

from perf.common import bootstrap_ci_nested

FIELDS = ("code", "workload", "instance", "ratios")
TARGET_WIDTH = 0.02
TREE = ("retire", "perf", "conformance", "oracles", "conftest.py", "pyproject.toml")  # what the digests read
RESULTS = Path(__file__).resolve().parent.parent / "results"
CODE_MAP = RESULTS / "no-revision-code-map.json"
LEDGER_FILE = RESULTS / "no-revision-pairs.jsonl"  # `make no-revision-ci`'s ledger


def code_digest(root: Path | None = None) -> str:
    """16 hex digits over every `retire/**/*.py` (path and bytes, sorted) and the vLLM and torch versions."""
    from perf.served_code import engine_versions, files_digest

    root = root or Path(__file__).resolve().parent.parent / "retire"
    return files_digest(engine_versions(), root, sorted(root.rglob("*.py")))


def host_class() -> str:
    """The machine class of this run: CPU model name, which of AMX / AVX512-BF16 / AVX512 the CPU has (they choose
    vLLM's CPU attention ISA and whether bf16 is computed in hardware) and the CPU count."""
    import platform

    import torch

    name = _first_cpu().get("model name", platform.processor() or platform.machine())
    isa = [n for n, have in (("amx", torch.cpu._is_amx_tile_supported()),
                             ("avx512_bf16", torch.cpu._is_avx512_bf16_supported()),
                             ("avx512", torch.cpu._is_avx512_supported())) if have]
    return f"{name} | {'+'.join(isa) or 'no-avx512'} | {os.cpu_count()} cpu"


def _first_cpu(cpuinfo: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first CPU's block of `cpuinfo` as {field: value}; {} when it cannot be read."""
    fields = {}
    try:
        for ln in Path(cpuinfo).read_text().splitlines():
            if not ln.strip():
                break  # the first CPU's block only
            key, _, val = ln.partition(":")
            fields[key.strip()] = val.strip()
    except OSError:
        pass
    return fields


def cpu_id(cpuinfo: str = "/proc/cpuinfo", l2: str = "/sys/devices/system/cpu/cpu0/cache/index2/size") -> str:
    """The CPU under the machine class: vendor, family, model and stepping of the first CPU, and its L2 size (sysfs),
    e.g. "AuthenticAMD family 25 model 17 stepping 1 | L2 1024K"; a field it cannot read is "?"."""
    fields = _first_cpu(cpuinfo)
    try:
        size = Path(l2).read_text().strip()
    except OSError:
        size = "?"
    get = lambda k: fields.get(k) or "?"
    return f"{get('vendor_id')} family {get('cpu family')} model {get('model')} stepping {get('stepping')} | L2 {size}"


def served_digest(root: Path | None = None) -> str:
    """The digest of the measured `retire` modules (perf/served_code.py) under the repository `root`."""
    from perf import served_code

    return served_code.served_digest(root or served_code.ROOT)


def code_map(path: str | os.PathLike = CODE_MAP) -> dict[str, str]:
    """full `code` digest -> served digest, for lines written before `served` was recorded."""
    if not Path(path).exists():
        return {}
    return {full: e["served"] for full, e in json.loads(Path(path).read_text()).items()}


def _served_of(rec: dict, mapping: dict[str, str]) -> str | None:
    return rec.get("served") or mapping.get(rec["code"])


def append(path: str | os.PathLike, record: dict) -> None:
    missing = [f for f in FIELDS if f not in record]
    if missing:
        raise ValueError(f"ledger record lacks {missing}")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _records(path: str | os.PathLike, *, code: str, workload: str, harness: str, host: str | None,
             mapping: dict[str, str] | None) -> tuple[list[dict], int]:
    """(the records `load` pools, in file order; the number of lines of this workload it does not pool)."""
    mapping = code_map() if mapping is None else mapping
    recs, other = [], 0
    if not Path(path).exists():
        return recs, other
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            ok = isinstance(rec, dict) and all(f in rec for f in FIELDS) and isinstance(rec["ratios"], list)
        except json.JSONDecodeError:
            ok = False
        if not ok:
            raise ValueError(f"{path}:{n}: not a ledger record (needs {FIELDS}): {line[:120]!r}")
        if rec["workload"] != workload:
            continue
        if _served_of(rec, mapping) != code or rec.get("harness", "") != harness or rec.get("host") != host:
            other += 1
            continue
        recs.append(rec)
    return recs, other


def load(path: str | os.PathLike, *, code: str, workload: str, harness: str = "",
         host: str | None = None, mapping: dict[str, str] | None = None) -> tuple[list[list[float]], int]:
    """(ratio groups of the lines of this served digest `code`, workload, harness and machine class, number of lines
    of other code, another harness or another machine: a line without `harness` was measured without the quiescence
    barrier, perf/quiesce.py; a line without `host` predates the machine class and pools only when `host` is None; a
    line without `served` pools through `mapping`, by default the committed CODE_MAP)."""
    recs, other = _records(path, code=code, workload=workload, harness=harness, host=host, mapping=mapping)
    return [[float(x) for x in rec["ratios"]] for rec in recs], other


def by_cpu(records: list[dict]) -> dict[str, dict]:
    """Pooled ledger records (`_records`) broken down by their recorded `cpu` ("unrecorded" for lines without one):
    per CPU, the instances, the median ratio and its nested 95% interval. A diagnostic beside the pool, never a
    filter on it."""
    split: dict[str, list[list[float]]] = {}
    for rec in records:
        split.setdefault(rec.get("cpu") or "unrecorded", []).append([float(x) for x in rec["ratios"]])
    out = {}
    for cpu, groups in split.items():
        full = interval(groups)
        out[cpu] = {k: full[k] for k in ("instances", "pairs", "median_ratio", "nested_ci95", "width")}
    return out


def interval(groups: list[list[float]], *, other_code: int = 0) -> dict:
    """The pooled figures: instances, pairs, median ratio, nested 95% interval and its width, and the pairs the
    target width needs at this spread (width scales as 1/sqrt(pairs))."""
    pairs = sum(len(g) for g in groups)
    ci = bootstrap_ci_nested(groups, n=2000, seed=0)
    out = {"instances": len(groups), "pairs": pairs, "other_code_lines": other_code,
           "median_ratio": round(statistics.median(x for g in groups for x in g), 4) if pairs else None,
           "nested_ci95": [round(x, 4) for x in ci] if ci else None, "width": None, "target_width": TARGET_WIDTH,
           "pairs_needed": None}
    if ci:
        width = ci[1] - ci[0]
        out["width"] = round(width, 4)
        out["pairs_needed"] = max(pairs, round(pairs * (width / TARGET_WIDTH) ** 2))
    out.update(_geometric(groups))
    return out


def _geometric(groups: list[list[float]]) -> dict:
    """The secondary estimator: the geometric mean of the ratios (exp of the mean log ratio) with the same nested
    bootstrap. For a symmetric spread of log ratios it estimates the same centre as the median with about 1/1.25 of
    the median's interval width (the mean's efficiency); it is reported next to the median, never instead of it."""
    logs = [[float(np.log(x)) for x in g if x and x > 0] for g in groups]
    ci = bootstrap_ci_nested(logs, stat=np.mean, n=2000, seed=0)
    flat = [x for g in logs for x in g]
    return {"geo_mean_ratio": round(float(np.exp(np.mean(flat))), 4) if flat else None,
            "geo_nested_ci95": [round(float(np.exp(x)), 4) for x in ci] if ci else None,
            "geo_width": round(float(np.exp(ci[1]) - np.exp(ci[0])), 4) if ci else None}


def pooled(path: str | os.PathLike, *, code: str, workload: str, harness: str = "", host: str | None = None,
           mapping: dict[str, str] | None = None) -> dict:
    """`interval` over the ledger's lines of this served digest, workload, harness and machine class."""
    groups, other = load(path, code=code, workload=workload, harness=harness, host=host, mapping=mapping)
    return interval(groups, other_code=other)


def map_commits(revs: list[str], path: str | os.PathLike = CODE_MAP, repo: Path | None = None) -> dict:
    """Add `full digest -> served digest` entries for git revisions `revs`, each computed from that commit's own
    tree (`git archive`) with the installed vLLM and torch: the full digest is recomputed exactly as `code_digest`
    computed it when the lines were written, so an entry only matches lines of that code. An entry that exists with
    another served digest is an error, and nothing is written."""
    import io
    import subprocess
    import tarfile
    import tempfile

    repo = repo or Path(__file__).resolve().parent.parent
    entries = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    for rev in revs:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", rev], check=True, capture_output=True,
                                text=True).stdout.strip()
        top = subprocess.run(["git", "-C", str(repo), "ls-tree", "--name-only", commit], check=True,
                             capture_output=True, text=True).stdout.split()
        with tempfile.TemporaryDirectory() as tmp:
            tar = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit,
                                  *(p for p in TREE if p in top)], check=True, capture_output=True).stdout
            with tarfile.open(fileobj=io.BytesIO(tar)) as t:
                t.extractall(tmp, filter="data")
            full, served = code_digest(Path(tmp) / "retire"), served_digest(Path(tmp))
        if full in entries and entries[full]["served"] != served:
            raise ValueError(f"{rev}: code {full} is mapped to served {entries[full]['served']}, this tree gives "
                             f"{served}")
        entries.setdefault(full, {"served": served, "commit": commit[:12]})
    Path(path).write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
    return entries


def status(path: str | os.PathLike, workload: str, harness: str) -> dict:
    """Where the series of THIS checkout and machine stands: the pooled interval of `workload` (for the retire/stock
    pairs, "1K-c1"; for the A/A control, "1K-c1/stock-stock") under the current served digest, `harness` and host
    class, without starting an engine, with the pooled lines broken down by recorded CPU (`by_cpu`)."""
    code, host = served_digest(), host_class()
    recs, other = _records(path, code=code, workload=workload, harness=harness, host=host, mapping=None)
    return {"served": code, "host": host, "harness": harness, "workload": workload,
            **interval([[float(x) for x in r["ratios"]] for r in recs], other_code=other), "by_cpu": by_cpu(recs)}


USAGE = """usage: python -m perf.pairs_ledger map REV [REV ...]    add code-map entries computed from those commits
       python -m perf.pairs_ledger status HARNESS [LEDGER]  the pooled intervals of this checkout and machine"""

if __name__ == "__main__":
    import sys

    cmd, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if cmd == "map" and args:
        print(json.dumps(map_commits(args), indent=1))
    elif cmd == "status" and 1 <= len(args) <= 2:
        ledger = args[1] if len(args) > 1 else LEDGER_FILE
        for w in ("1K-c1", "1K-c1/stock-stock"):
            print(json.dumps(status(ledger, w, args[0])))
    else:
        sys.exit(USAGE)
