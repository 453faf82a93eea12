"""Tenants from credentials, and each tenant's prefix-cache namespace.

Invariants:
- A tenant is decided only by the bearer key (`--api-keys FILE`); nothing in a request body or header names it.
  Without a key file there is one tenant, `default`, and no key is required.
- Every request runs under a server-side `cache_salt` derived from the typed tuple (tenant, client salt or None) by
  a digest of its JSON encoding, so two tenants never share a prefix-cache namespace, and a client-supplied salt only
  selects a namespace inside its own tenant (it can never name another tenant's, whatever characters it holds).
"""
from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

DEFAULT_TENANT = "default"
SALT_DOMAIN = "retire.serve.cache_salt.v1"


class Tenants:
    def __init__(self, keys: dict[str, str] | None = None):
        self.keys = dict(keys or {})
        self.required = bool(self.keys)

    @classmethod
    def from_file(cls, path: str | None) -> "Tenants":
        """`path`: a JSON object {key: tenant}, or lines `KEY TENANT` (blank lines and `#` comments ignored)."""
        if path is None:
            return cls()
        text = Path(path).read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        keys: dict[str, str] = {}
        if isinstance(data, dict):
            pairs = list(data.items())
        else:
            pairs = []
            for n, line in enumerate(text.splitlines(), 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                parts = line.split(None, 1)
                if len(parts) != 2:
                    raise ValueError(f"{path}:{n}: expected 'KEY TENANT'")
                pairs.append((parts[0], parts[1].strip()))
        for k, t in pairs:
            if not isinstance(k, str) or not isinstance(t, str) or not k or not t:
                raise ValueError(f"{path}: keys and tenants must be non-empty strings")
            if k in keys:
                raise ValueError(f"{path}: key listed twice")
            keys[k] = t
        if not keys:
            raise ValueError(f"{path}: no keys")
        return cls(keys)

    def tenant_of(self, authorization: str | None) -> str | None:
        """The tenant for an `Authorization` header value; None if a key is required and missing or unknown."""
        if not self.required:
            return DEFAULT_TENANT
        if not authorization or not authorization.lower().startswith("bearer "):
            return None
        given = authorization[7:].strip()
        found = None
        for k, t in self.keys.items():  # constant-time per key; every key is compared
            if hmac.compare_digest(k.encode(), given.encode()):
                found = t
        return found

    @property
    def names(self) -> list[str]:
        return sorted(set(self.keys.values())) if self.required else [DEFAULT_TENANT]


def cache_salt(tenant: str, client_salt: str | None) -> str:
    """The prefix-cache namespace of (tenant, client salt): a digest of the typed tuple, never a joined string."""
    blob = json.dumps([SALT_DOMAIN, tenant, client_salt], ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()
