"""Shared-memory files mapped by the frontend, EngineCore and the workers (the revocation mailbox, rank receipts).

Invariant: a file is created zero-filled at its full size before any process maps it, under /dev/shm when present;
its path reaches child processes through an environment variable set before they are spawned (`from_env`). Every
mapping is the whole file; `unlink()` closes this mapping and removes the file (other processes keep theirs).
"""
from __future__ import annotations

import mmap
import os
import uuid


def create_file(prefix: str, size: int) -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    path = os.path.join(base, f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    with open(path, "wb") as f:
        f.write(b"\0" * size)
    return path


class SharedFile:
    SIZE: int = 0
    ENV: str = ""

    def __init__(self, path: str):
        self.path = path
        self._f = open(path, "r+b")
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
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
