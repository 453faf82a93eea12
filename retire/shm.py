"""Shared-memory files mapped by the frontend, EngineCore and the workers (the revocation mailbox, rank receipts).

Invariants:
- A file is created zero-filled at its full size before any process maps it, under /dev/shm when present, named
  `{prefix}-{creator pid}-{8 hex}`; its path reaches child processes through an environment variable set before they
  are spawned (`from_env`). Every mapping is the whole file; `unlink()` closes this mapping and removes the file
  (other processes keep theirs).
- Every process that has the file open holds a shared `flock` on it, the creator from creation on. The kernel drops
  the lock when a process dies, however it dies.
- No leaked file outlives its owners for long: `create_file` first removes the files of its prefix that no process
  holds AND whose creator pid is not alive (`sweep_stale`), i.e. those a SIGKILLed frontend left behind. A file any
  live process holds is never removed (the lock test works across PID namespaces that share /dev/shm; the pid test
  protects files of a live process that predates the locks).
"""
from __future__ import annotations

import fcntl
import mmap
import os
import re
import uuid

_HELD: dict[str, int] = {}  # path -> the creator's locked fd, until unlink()


def _base() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"


def create_file(prefix: str, size: int, base: str | None = None) -> str:
    base = base or _base()
    sweep_stale(prefix, base)
    path = os.path.join(base, f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)  # held from before the file has any content: never swept while we live
    os.write(fd, b"\0" * size)
    _HELD[path] = fd
    return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(prefix: str, base: str | None = None) -> list[str]:
    """Remove `{prefix}-{pid}-{hex}` files no process holds and whose creator pid is gone; return their paths."""
    base = base or _base()
    pat = re.compile(re.escape(prefix) + r"-(\d+)-[0-9a-f]{8}")
    removed = []
    for name in os.listdir(base):
        m = pat.fullmatch(name)
        if m is None or _pid_alive(int(m.group(1))):
            continue
        path = os.path.join(base, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while any process holds it
        except BlockingIOError:
            continue
        else:
            os.unlink(path)
            removed.append(path)
        finally:
            os.close(fd)
    return removed


def _release(path: str) -> None:
    fd = _HELD.pop(path, None)
    if fd is not None:
        os.close(fd)


class SharedFile:
    SIZE: int = 0
    ENV: str = ""

    def __init__(self, path: str):
        self.path = path
        self._f = open(path, "r+b")
        fcntl.flock(self._f.fileno(), fcntl.LOCK_SH)  # this process holds the file while it has it open
        self.mm = mmap.mmap(self._f.fileno(), self.SIZE)

    @classmethod
    def from_env(cls):
        p = os.environ.get(cls.ENV)
        return cls(p) if p and os.path.exists(p) else None

    def close(self) -> None:
        try:
            self.mm.close()
            self._f.close()
        except Exception:  # noqa: BLE001 - already closed, or the interpreter is shutting down
            pass

    def unlink(self) -> None:
        self.close()
        _release(self.path)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
