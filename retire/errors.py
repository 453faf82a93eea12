"""Typed errors. Invariant: a call that raises one of these changed nothing (no epoch advanced, no request added)."""
from __future__ import annotations


class RetireError(Exception):
    """Base class of every error raised by the retire control plane."""


class SupersedeRefused(RetireError):
    """A SUPERSEDE was refused (compare-and-swap failed, unknown scope, ...). The old version keeps running untouched."""


class UnknownScope(SupersedeRefused, KeyError):
    """No scope with this (tenant, scope id). Another tenant's scope is unknown to you by construction."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0]) if self.args else "unknown scope"


class StaleEpoch(SupersedeRefused):
    """`expected_epoch` is not the scope's current epoch (stale or duplicate SUPERSEDE)."""


class InvalidRequest(RetireError, ValueError):
    """Malformed input: empty prompt, prompt too long, token id outside the vocabulary, bad sampling params."""


class UnsupportedContract(InvalidRequest):
    """The contract asks for something this engine configuration cannot honour."""


class ScopeExists(InvalidRequest):
    """`submit` named a scope that already exists; revise it with `supersede` instead."""


class EngineClosed(RetireError, RuntimeError):
    """The engine was closed; no further calls are accepted."""


class AuditFailed(RetireError, AssertionError):
    """`audit()` found a violated invariant (leaked block, dangling pin, live obsolete execution)."""

    def __init__(self, report: dict):
        self.report = report
        super().__init__(f"audit failed: {report.get('violations')}")


class SeamMissing(RetireError, ImportError):
    """The installed vLLM lacks an extension seam retire relies on."""
