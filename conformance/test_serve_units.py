"""Engine-free parts of `retire serve`: tenants and salts, scope routes and SUPERSEDE bodies, the probe's byte
accounting. Each check has its failing case next to it."""
from __future__ import annotations

import json

import pytest

from conformance.fixtures.sse_probe import Event, obsolete_after
from retire.serve.scopes import BadRequest, parse_contract, route, supersede_fields
from retire.serve.tenants import Tenants, cache_salt
from retire.types import Contract


def test_salts_are_digests_of_typed_tuples():
    """No joined string: (tenant "a", salt "b:c") and (tenant "a:b", salt "c") are different namespaces, and so
    are a missing salt and an empty one; the same pair is stable."""
    assert cache_salt("a", "b:c") != cache_salt("a:b", "c")
    assert cache_salt("a", None) != cache_salt("a", "") != cache_salt("a", "None")
    assert cache_salt("t", "x") == cache_salt("t", "x") and len(cache_salt("t", "x")) == 64
    assert cache_salt("alpha", "x") != cache_salt("beta", "x")


def test_key_file_formats_and_auth(tmp_path):
    lines = tmp_path / "keys.txt"
    lines.write_text("# comment\nk1 alpha\n\nk2 beta team\n")
    t = Tenants.from_file(str(lines))
    assert t.tenant_of("Bearer k1") == "alpha" and t.tenant_of("bearer k2") == "beta team"
    assert t.tenant_of(None) is None and t.tenant_of("Bearer nope") is None and t.tenant_of("k1") is None
    js = tmp_path / "keys.json"
    js.write_text(json.dumps({"k1": "alpha"}))
    assert Tenants.from_file(str(js)).tenant_of("Bearer k1") == "alpha"
    assert Tenants().tenant_of(None) == "default"  # no key file: one tenant, no key needed
    bad = tmp_path / "bad.txt"
    bad.write_text("k1 alpha\nk1 beta\n")
    with pytest.raises(ValueError, match="listed twice"):
        Tenants.from_file(str(bad))


def test_routes_and_scope_names():
    r = route("POST", b"/v1/scopes/a%2Fb%20c/supersede", [])
    assert (r.kind, r.scope, r.endpoint) == ("supersede", "a/b c", None)
    assert route("POST", b"/v1/scopes/s/supersede/chat/completions", []).endpoint == "chat"
    assert route("GET", b"/v1/scopes/s", []).kind == "info"
    assert route("POST", b"/v1/completions", [(b"x-session-id", b"sess")]) .kind == "start"
    assert route("POST", b"/v1/completions", []).kind == "plain"
    with pytest.raises(BadRequest, match="different scopes"):
        route("POST", b"/v1/completions", [(b"x-session-id", b"a"), (b"x-retire-scope", b"b")])
    with pytest.raises(BadRequest, match="another scope than the path"):
        route("POST", b"/v1/scopes/a/supersede", [(b"x-retire-scope", b"b")])
    with pytest.raises(BadRequest) as e:
        route("POST", b"/v1/scopes/a/bogus", [])
    assert e.value.status == 404


def test_supersede_body_checks():
    d = {"expected_epoch": 2, "prompt": [1, 2], "contract": {"mode": "exact", "pin_quota_blocks": 0}}
    ep, c, endpoint = supersede_fields(d, None)
    assert (ep, endpoint, c) == (2, "completion", Contract(mode="exact", pin_quota_blocks=0))
    assert "expected_epoch" not in d and "contract" not in d  # stripped before vLLM sees the body
    for body, match in [({"prompt": [1]}, "required"), ({"expected_epoch": True, "prompt": [1]}, "integer"),
                        ({"expected_epoch": -1, "prompt": [1]}, "integer"),
                        ({"expected_epoch": 0, "prompt": [1], "messages": []}, "either"),
                        ({"expected_epoch": 0}, "required"), ({"expected_epoch": 0, "prompt": [[1], [2]]}, "one"),
                        ({"expected_epoch": 0, "prompt": [1], "n": 2}, "n == 1")]:
        with pytest.raises(BadRequest, match=match):
            supersede_fields(dict(body), None)
    with pytest.raises(BadRequest, match="takes messages"):
        supersede_fields({"expected_epoch": 0, "prompt": [1]}, "chat")
    with pytest.raises(BadRequest, match="unknown contract field"):
        parse_contract({"modes": "exact"})
    with pytest.raises(BadRequest, match="wrong type"):
        parse_contract({"pin_quota_blocks": True})


def _ev(start, n):
    return Event(start, json.dumps({"choices": [{"token_ids": list(range(n))}]}), 0.0)


def test_probe_boundary_accounting():
    """Events in wire order; `boundary` = bytes written before the accept (upper bound). An event straddling the
    boundary is the one partial write held in user space: everything after it counts. Without a straddler the first
    event at the boundary is excused (it may be a whole write held in user space), the rest counts."""
    evs = [_ev(0, 1), _ev(100, 1), _ev(200, 5), _ev(300, 7)]
    assert obsolete_after(evs, 150)[0] == 12   # event at 100 straddles 150: 200 and 300 count
    assert obsolete_after(evs, 200)[0] == 7    # no straddler: the event at 200 is excused
    assert obsolete_after(evs, 400)[0] == 0    # everything was written before the accept


def test_error_shape_checker():
    from conformance.fixtures.http import error_shape_ok
    from retire.serve import errors

    assert error_shape_ok(json.loads(errors.body(409, "stale", param="expected_epoch", current_epoch=3)), 409)
    assert not error_shape_ok(json.loads(errors.body(409, "stale")), 400)          # wrong code
    assert not error_shape_ok({"detail": "Not Found"}, 404)                        # FastAPI's default shape
    assert not error_shape_ok({"error": {"message": "x", "code": 400}}, 400)       # no type / param
