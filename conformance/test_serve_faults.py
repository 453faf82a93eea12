"""`retire serve` while starting and after its engine died: clean errors, an unhealthy /health, no hang.

One server for the module: its startup window is observed (503 in OpenAI's error shape until ready), then its
EngineCore process is killed (SIGKILL) while a scoped stream and an unscoped stream are being read.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from conformance.fixtures.http import completion_body, error_shape_ok, scope_hdr
from conformance.fixtures.prompts import tokens
from conformance.fixtures.servers import ServerProcess, wait_until


@pytest.fixture(scope="module")
def booting(device):
    s = ServerProcess("retire", "unit")
    yield s
    s.stop(timeout=15)


def test_503_while_the_engine_starts(booting):
    """The URL is printed and answered before the engine is up: /health and every API route get a 503 in
    OpenAI's error shape. Negative control: after the ready line the same requests succeed."""
    assert booting.started.wait(120), booting.log_tail()
    assert not booting.ready.is_set(), "inconclusive: the engine was up before the first request"
    with httpx.Client(base_url=booting.url, timeout=30) as c:
        h = c.get("/health")
        r = c.post("/v1/completions", json=completion_body([5, 6, 7], 2))
        was_ready = booting.ready.is_set()
        assert not was_ready, "inconclusive: the engine came up while the requests were in flight"
        assert h.status_code == 503 and r.status_code == 503
        assert error_shape_ok(h.json(), 503) and "starting" in r.json()["error"]["message"]
        booting.wait_ready()
        assert c.get("/health").status_code == 200
        assert c.post("/v1/completions", json=completion_body([5, 6, 7], 2)).status_code == 200


def _read(c: httpx.Client, body: dict, headers: dict, out: dict, key: str, started: threading.Event) -> None:
    """Read one stream to its end, recording chunks, error events and how it ended (the client's view)."""
    rec = out[key] = {"chunks": 0, "errors": [], "done": False, "exc": None}
    try:
        with c.stream("POST", "/v1/completions", json=body, headers=headers) as r:
            rec["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: [DONE]"):
                    rec["done"] = True
                elif line.startswith("data: "):
                    rec["chunks"] += 1
                    if '"error"' in line:
                        rec["errors"].append(line)
                    if rec["chunks"] == 3:
                        started.set()
    except httpx.HTTPError as e:  # a clean transport-level end is acceptable; a hang is not
        rec["exc"] = repr(e)
    finally:
        started.set()
        rec["t_end"] = time.monotonic()


def test_engine_killed_mid_stream(booting):
    """SIGKILL the EngineCore while two streams are read: both end within a bound (an error event then [DONE], or a
    closed connection), /health turns 503, new requests get 503 in OpenAI's shape, and the server process stays up
    to say so."""
    booting.wait_ready()
    [pid] = booting.engine_pids()
    out: dict = {}
    with httpx.Client(base_url=booting.url, timeout=httpx.Timeout(60, read=60)) as c:
        started = [threading.Event(), threading.Event()]
        ts = [threading.Thread(target=_read, args=(c, completion_body(tokens(64, 90 + i), 1900, stream=True,
                                                                      logprobs=None), h, out, k, ev))
              for i, (k, h, ev) in enumerate([("scoped", scope_hdr("doomed"), started[0]),
                                              ("plain", {}, started[1])])]
        for t in ts:
            t.start()
        for ev in started:
            assert ev.wait(60)
        t_kill = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        for t in ts:
            t.join(60)
        assert not any(t.is_alive() for t in ts), "a stream hung after the engine died"
        for k, rec in out.items():
            assert rec["chunks"] >= 3, (k, rec)
            assert rec["errors"] or rec["exc"] or rec["done"], (k, rec)
            assert rec["t_end"] - t_kill < 60
        wait_until(lambda: c.get("/health").status_code == 503, 30, "/health to report the dead engine")
        r = c.post("/v1/completions", json=completion_body([5, 6, 7], 2), headers=scope_hdr("after"))
        assert r.status_code == 503 and error_shape_ok(r.json(), 503), r.text
        assert booting.proc.poll() is None, "the server should stay up and report unhealthy"
    print(f"\nafter the kill: {({k: (v['chunks'], bool(v['errors']), v['exc']) for k, v in out.items()})}")
