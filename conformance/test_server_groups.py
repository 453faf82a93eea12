"""Test servers die with the test process (conformance/fixtures/groups.py), engine-free.

A stand-in for pytest (a child python) starts a stand-in for `retire serve` (a `sleep` leading its own process group)
and is then sent SIGTERM; the server must be gone. Negative control: the same group started with a plain
`subprocess.Popen(process_group=0)`, as the fixture did before, survives its parent's SIGTERM."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import psutil
import pytest

from conformance.fixtures.servers import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARENT = """import sys, time
sys.path.insert(0, {root!r})
from conformance.fixtures import groups
import subprocess
argv = ["sleep", "120"]
p = groups.spawn(argv) if {guarded} else subprocess.Popen(argv, process_group=0)
print(p.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def sigtermed_parent():
    """run(guarded) -> pid of the server the parent started, after the parent was sent SIGTERM and exited."""
    left = []

    def run(guarded: bool) -> int:
        parent = subprocess.Popen([sys.executable, "-c", PARENT.format(root=ROOT, guarded=guarded)],
                                  stdout=subprocess.PIPE, text=True)
        server = int(parent.stdout.readline())
        left.append(server)
        assert _alive(server)
        parent.send_signal(signal.SIGTERM)
        parent.wait(30)
        return server

    yield run
    for pid in left:  # heal: no stand-in server outlives its test
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.timeout(60)
def test_a_server_group_dies_when_its_test_process_is_sent_sigterm(sigtermed_parent):
    server = sigtermed_parent(True)
    wait_until(lambda: not _alive(server), 10, "the server to die with its SIGTERMed test process")


@pytest.mark.timeout(60)
def test_negative_control_an_unrecorded_group_outlives_its_parent(sigtermed_parent):
    server = sigtermed_parent(False)
    with pytest.raises(TimeoutError):  # a plain process group survives its parent: without groups the test fails
        wait_until(lambda: not _alive(server), 1.0, "a plain process group to die with its parent")
