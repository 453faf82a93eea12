"""Scopes over HTTP: which requests are scoped, the SUPERSEDE body, and how a transition is reported.

Invariants:
- The scope of a request comes from the `X-Retire-Scope` header, else `x-session-id` (what session-affinity routers
  hash on), else the `/v1/scopes/{scope}/...` path; two of them naming different scopes is a 400. The tenant is never
  read from here (see `tenants`).
- A SUPERSEDE body is checked completely (`expected_epoch`, `contract`, exactly one of `messages` / `prompt`, one
  prompt, `n == 1`) before anything is sent to the engine, so a refused SUPERSEDE changes nothing.
- Scope names travel percent-encoded in paths and are compared as decoded strings; any string is a valid name.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import unquote

from ..types import Contract

SCOPE_HEADERS = (b"x-retire-scope", b"x-session-id")
CONTRACT_FIELDS = {"mode": (str,), "inherit": (bool,), "pin_quota_blocks": (int, type(None)),
                   "dram_tier": (bool,), "digests": (bool,)}
ENDPOINT_PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


@dataclass(frozen=True)
class Route:
    kind: str                 # "info" | "supersede" | "start" | "plain"
    scope: str | None
    endpoint: str | None      # "chat" | "completion" | None (decided by the body)


def header_scope(headers: list[tuple[bytes, bytes]]) -> str | None:
    found = {}
    for k, v in headers:
        k = k.lower()
        if k in SCOPE_HEADERS:
            try:
                found.setdefault(k, v.decode("utf-8"))
            except UnicodeDecodeError:
                raise BadRequest(f"{k.decode()} is not UTF-8", k.decode()) from None
    names = set(found.values())
    if len(names) > 1:
        raise BadRequest("X-Retire-Scope and x-session-id name different scopes", "x-retire-scope")
    name = names.pop() if names else None
    if name == "":
        raise BadRequest("empty scope name", "x-retire-scope")
    return name


def route(method: str, raw_path: bytes, headers) -> Route:
    hdr = header_scope(headers)
    parts = raw_path.split(b"?", 1)[0].split(b"/")
    if len(parts) >= 4 and parts[1] == b"v1" and parts[2] == b"scopes":
        name = unquote(parts[3].decode("latin-1"))
        if not name:
            raise BadRequest("empty scope name", "scope")
        if hdr is not None and hdr != name:
            raise BadRequest("the scope header names another scope than the path", "x-retire-scope")
        rest = [p.decode("latin-1") for p in parts[4:]]
        if not rest and method == "GET":
            return Route("info", name, None)
        if method == "POST" and rest[:1] == ["supersede"]:
            tail = "/".join(rest[1:])
            endpoint = {"": None, "chat/completions": "chat", "completions": "completion"}.get(tail, "?")
            if endpoint != "?":
                return Route("supersede", name, endpoint)
        raise BadRequest(f"no route {method} {raw_path.decode('latin-1')}", status=404)
    path = raw_path.split(b"?", 1)[0]
    if hdr is not None and method == "POST" and path in (b"/v1/completions", b"/v1/chat/completions"):
        return Route("start", hdr, "chat" if path.endswith(b"chat/completions") else "completion")
    return Route("plain", None, None)


def parse_body(raw: bytes) -> dict:
    try:
        data = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    return data


def check_single(data: dict, endpoint: str) -> None:
    """A scoped request is one version: one prompt, one sequence."""
    for f in ("n", "best_of"):
        v = data.get(f)
        if v is not None and v != 1:
            raise BadRequest(f"a scoped request needs {f} == 1", f)
    if data.get("use_beam_search"):
        raise BadRequest("a scoped request cannot use beam search", "use_beam_search")
    if endpoint == "completion":
        p = data.get("prompt")
        batch = isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p)
        if batch and len(p) != 1:
            raise BadRequest("a scoped request takes exactly one prompt", "prompt")


def supersede_fields(data: dict, endpoint: str | None) -> tuple[int, Contract, str]:
    """Pop and check `expected_epoch` and `contract`; decide the endpoint from `messages` / `prompt`."""
    if "expected_epoch" not in data:
        raise BadRequest("expected_epoch is required", "expected_epoch")
    ep = data.pop("expected_epoch")
    if not isinstance(ep, int) or isinstance(ep, bool) or ep < 0:
        raise BadRequest("expected_epoch must be an integer >= 0", "expected_epoch")
    contract = parse_contract(data.pop("contract", None))
    has_m, has_p = "messages" in data, "prompt" in data
    if has_m and has_p:
        raise BadRequest("give either messages or prompt, not both", "messages")
    body_endpoint = "chat" if has_m else "completion" if has_p else None
    if body_endpoint is None:
        raise BadRequest("messages or prompt is required", "messages")
    if endpoint is not None and endpoint != body_endpoint:
        raise BadRequest(f"this route takes {'messages' if endpoint == 'chat' else 'prompt'}",
                         "messages" if endpoint == "chat" else "prompt")
    check_single(data, body_endpoint)
    return ep, contract, body_endpoint


def parse_contract(c) -> Contract:
    if c is None:
        return Contract()
    if not isinstance(c, dict):
        raise BadRequest("contract must be an object", "contract")
    for k, v in c.items():
        if k not in CONTRACT_FIELDS:
            raise BadRequest(f"unknown contract field {k!r} (known: {sorted(CONTRACT_FIELDS)})", "contract")
        if not isinstance(v, CONTRACT_FIELDS[k]) or (isinstance(v, bool) and bool not in CONTRACT_FIELDS[k]):
            raise BadRequest(f"contract.{k} has the wrong type", "contract")
    return Contract(**c)


def transition_info(scope: str, res, policy: str) -> dict:
    """What a facade call did: the epoch, and for a SUPERSEDE the transition (JSON-ready)."""
    if isinstance(res, int):
        return {"scope": scope, "epoch": res, "policy": policy}
    tr = res
    return {"scope": scope, "epoch": tr.epoch, "policy": tr.policy, "inherited_tokens": tr.inherited_tokens,
            "cold_reason": tr.cold_reason, "fence_latency_s": tr.fence_latency,
            "admit_s": tr.timings.get("admit"), "fence_path": tr.receipts[0].path if tr.receipts else None,
            "successor_ttft_s": tr.successor_ttft}


def info_headers(info: dict) -> list[tuple[bytes, bytes]]:
    def enc(v) -> bytes:
        s = f"{v:.6f}" if isinstance(v, float) else str(v)
        return s.encode("ascii", "replace")[:256].replace(b"\r", b" ").replace(b"\n", b" ")
    names = {"epoch": b"x-retire-epoch", "policy": b"x-retire-policy", "inherited_tokens": b"x-retire-inherited-tokens",
             "cold_reason": b"x-retire-cold-reason", "fence_latency_s": b"x-retire-fence-latency",
             "admit_s": b"x-retire-admit-latency", "fence_path": b"x-retire-fence-path"}
    return [(h, enc(info[k])) for k, h in names.items() if info.get(k) is not None]


def scope_json(eng, scope: str, tenant: str) -> dict:
    """GET /v1/scopes/{scope}: the current epoch and every transition (raises UnknownScope for another tenant's)."""
    epoch = eng.current_epoch(scope, tenant)
    trs = eng.transitions(scope, tenant)
    return {"object": "retire.scope", "id": scope, "epoch": epoch, "policy": eng.policy,
            "transitions": [transition_info(scope, t, eng.policy) for t in trs]}
