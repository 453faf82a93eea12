"""retire: versioned execution for vLLM (SUPERSEDE with ADVANCE, FENCE, ALIGN, RESUME, RECLAIM)."""
from .errors import (AuditFailed, EngineClosed, InvalidRequest, RetireError, ScopeExists, SeamMissing, StaleEpoch,
                     SupersedeRefused, UnknownScope, UnsupportedContract)
from .types import Certificate, Contract, Frame, Receipt, Transition

__all__ = ["RetireEngine", "Contract", "Frame", "Transition", "Certificate", "Receipt", "SupersedeRefused",
           "UnknownScope", "StaleEpoch", "InvalidRequest", "UnsupportedContract", "ScopeExists", "EngineClosed",
           "AuditFailed", "RetireError", "SeamMissing", "POLICIES"]


def __getattr__(name):  # keep `import retire` light: vLLM is imported only when an engine is built
    if name in ("RetireEngine", "POLICIES"):
        from . import engine
        return getattr(engine, name)
    raise AttributeError(name)
