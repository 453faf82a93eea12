"""Shared-memory files leave nothing behind (retire/shm.py), engine-free.

Oracle: the directory listing and the kernel's process table; child processes play the frontend that creates a file
and then dies (SIGKILL: no cleanup of its own runs), or lives on holding it. Every test works in its own directory.
"""
from __future__ import annotations

import fcntl
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from retire import shm

SHM = Path(shm.__file__)
# the child loads retire/shm.py alone (not the package: no vLLM import), creates or opens a file, prints, then waits
CHILD = ("import importlib.util, sys, time\n"
         "spec = importlib.util.spec_from_file_location('shm', {path!r})\n"
         "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
         "{body}\n"
         "sys.stdout.flush(); time.sleep(60)\n")
PREFIX = "retire-test"


@pytest.fixture
def child():
    procs = []

    def start(body: str) -> tuple[subprocess.Popen, str]:
        p = subprocess.Popen([sys.executable, "-c", CHILD.format(path=str(SHM), body=body)], stdout=subprocess.PIPE,
                             text=True)
        procs.append(p)
        return p, p.stdout.readline().strip()  # barrier: the child has done its part

    yield start
    for p in procs:  # heal: no child outlives its test
        p.kill()
        p.wait()


def _kill(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait()


def test_a_file_its_dead_creator_left_is_swept_by_the_next_create(tmp_path, child):
    p, path = child(f"print(m.create_file({PREFIX!r}, 64, {str(tmp_path)!r}))")
    assert os.path.exists(path)
    _kill(p)
    mine = shm.create_file(PREFIX, 64, str(tmp_path))
    assert not os.path.exists(path), "the SIGKILLed creator's file survived the next create"
    assert os.listdir(tmp_path) == [os.path.basename(mine)]


def test_a_live_creators_file_is_kept(tmp_path, child):
    _, path = child(f"print(m.create_file({PREFIX!r}, 64, {str(tmp_path)!r}))")
    assert shm.sweep_stale(PREFIX, str(tmp_path)) == []
    assert os.path.exists(path)


def test_a_file_a_live_process_still_holds_is_kept_after_its_creator_died(tmp_path, child):
    creator, path = child(f"print(m.create_file({PREFIX!r}, 64, {str(tmp_path)!r}))")
    # an EngineCore that outlives its frontend: it opened the file by path and holds it
    holder, _ = child(f"class F(m.SharedFile):\n    SIZE = 64\nf = F({path!r}); print('open')")
    _kill(creator)
    assert shm.sweep_stale(PREFIX, str(tmp_path)) == []
    assert os.path.exists(path)
    _kill(holder)
    assert shm.sweep_stale(PREFIX, str(tmp_path)) == [path]


def test_an_unlocked_file_of_a_live_pid_is_kept(tmp_path, child):
    """A file from a live process of an earlier version (no lock taken) is not swept: its pid is alive. (A child's
    pid, not this process's: a sweep that signals would end the child, not the test run.)"""
    p, _ = child("print('up')")
    path = tmp_path / f"{PREFIX}-{p.pid}-0123abcd"
    path.write_bytes(b"\0" * 64)
    assert shm.sweep_stale(PREFIX, str(tmp_path)) == []
    assert path.exists()


def test_names_outside_the_pattern_are_never_touched(tmp_path, child):
    p, path = child(f"print(m.create_file({PREFIX!r}, 64, {str(tmp_path)!r}))")
    _kill(p)
    pid = os.path.basename(path).split("-")[2]
    others = [f"{PREFIX}-{pid}-notahexid", f"{PREFIX}x-{pid}-0123abcd", f"other-{pid}-0123abcd", f"{PREFIX}-{pid}"]
    for n in others:
        (tmp_path / n).write_bytes(b"x")
    assert shm.sweep_stale(PREFIX, str(tmp_path)) == [path]
    assert sorted(os.listdir(tmp_path)) == sorted(others)


def test_unlink_removes_the_file_and_releases_the_creators_hold(tmp_path):
    class F(shm.SharedFile):
        SIZE = 64

    path = shm.create_file(PREFIX, 64, str(tmp_path))
    f = F(path)
    assert path in shm._HELD
    f.unlink()
    assert path not in shm._HELD and not os.path.exists(path)


def test_an_engine_that_fails_to_start_leaves_no_mailbox(monkeypatch):
    from retire import backend

    class Refusing:
        def start(self, model, kwargs):
            raise RuntimeError("engine refused to start (test)")

    monkeypatch.setattr(backend.adapter, "frontend", lambda: Refusing())
    monkeypatch.delenv("RETIRE_MAILBOX", raising=False)
    with pytest.raises(RuntimeError, match="refused to start"):
        backend.Backend("no-model")
    path = os.environ.get("RETIRE_MAILBOX")
    assert path and path.startswith(shm._base()), path
    assert not os.path.exists(path), "the failed start leaked its mailbox file"
    assert path not in shm._HELD


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_the_sweep_goes_on_past_every_file_it_keeps(tmp_path, child, monkeypatch):
    """Files it must keep (vanished, held, outside the pattern, a live pid's) come first: the stale one after them
    is still removed."""
    dead = _dead_pid()
    creator, held = child(f"print(m.create_file({PREFIX!r}, 64, {str(tmp_path)!r}))")
    holder, _ = child(f"class F(m.SharedFile):\n    SIZE = 64\nf = F({held!r}); print('open')")
    _kill(creator)
    stale = tmp_path / f"{PREFIX}-{dead}-0123abcd"
    stale.write_bytes(b"\0" * 64)
    live = tmp_path / f"{PREFIX}-{holder.pid}-0123abcd"
    live.write_bytes(b"\0" * 64)
    order = [f"{PREFIX}-{dead}-0badf00d", os.path.basename(held), "unrelated", live.name, stale.name]
    monkeypatch.setattr(shm.os, "listdir", lambda base: list(order))
    assert shm.sweep_stale(PREFIX, str(tmp_path)) == [str(stale)]
    assert os.path.exists(held) and live.exists()


def test_a_live_pid_is_only_probed_never_signalled(tmp_path):
    # the child blocks every signal and, once the sweep is done, prints the ones pending: a blocked signal is never
    # discarded, whatever disposition the child inherited (under `nohup`, SIGHUP is ignored and a SIGHUP would
    # otherwise leave no trace), and one the sweep sent is pending before the parent's write that asks for the list
    body = ("import signal\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())\n"
            "print('up', flush=True)\n"
            "sys.stdin.readline()\n"
            "print(sorted(int(s) for s in signal.sigpending()), flush=True)")
    p = subprocess.Popen([sys.executable, "-c", CHILD.format(path=str(SHM), body=body)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "up"
        path = tmp_path / f"{PREFIX}-{p.pid}-0123abcd"
        path.write_bytes(b"\0" * 64)
        assert shm.sweep_stale(PREFIX, str(tmp_path)) == []
        p.stdin.write("done\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "[]", "the sweep signalled a live process"
        assert path.exists()
    finally:
        p.kill()
        p.wait()


def test_a_pid_of_another_user_counts_as_alive(monkeypatch):
    def denied(pid, sig):
        raise PermissionError
    monkeypatch.setattr(shm.os, "kill", denied)
    assert shm._pid_alive(12345) is True


def test_the_created_file_is_named_sized_and_held_as_documented(tmp_path):
    path = shm.create_file(PREFIX, 64, str(tmp_path))
    name = os.path.basename(path)
    assert re.fullmatch(rf"{PREFIX}-{os.getpid()}-[0-9a-f]{{8}}", name), name
    assert os.path.getsize(path) == 64 and open(path, "rb").read() == b"\0" * 64
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644 & ~umask
    fd = shm._HELD[path]
    assert isinstance(fd, int)
    probe = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):  # the creator's shared lock is held
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(probe)

    class F(shm.SharedFile):
        SIZE = 64

    F(path).unlink()
    with pytest.raises(OSError):  # the creator's locked fd was closed with the file
        os.fstat(fd)


def test_unlink_of_a_file_another_process_created_releases_nothing_of_ours(tmp_path, child):
    _, path = child(f"print(m.create_file({PREFIX!r}, 64, {str(tmp_path)!r}))")

    class F(shm.SharedFile):
        SIZE = 64

    before = dict(shm._HELD)
    F(path).unlink()
    assert not os.path.exists(path) and shm._HELD == before


def test_the_base_is_dev_shm_when_present_else_tmp(monkeypatch):
    assert shm._base() == ("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    real = os.path.isdir
    monkeypatch.setattr(shm.os.path, "isdir", lambda p: True if p == "/dev/shm" else real(p))
    assert shm._base() == "/dev/shm"
    monkeypatch.setattr(shm.os.path, "isdir", lambda p: False if p == "/dev/shm" else real(p))
    assert shm._base() == "/tmp"
