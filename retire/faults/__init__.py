"""Fault injectors. Each declares `name` and `affects`, and has async inject/heal (and `async with f.on(target)`)."""
from .base import Composite, Fault, FaultConflict, compose
from .consumer import BusyConsumer, LateCompletion, ReleaseAtCall, SlowConsumer
from .kv import EngineRefusal, ForgedTenant, GenerationRace, PageCorruption
from .load import CoTenantLoad
from .numeric import UlpNoise
from .participants import DropRankReceipt
from .revocation import StuckRevocation

__all__ = ["Fault", "Composite", "FaultConflict", "compose", "SlowConsumer", "BusyConsumer", "LateCompletion",
           "ReleaseAtCall", "PageCorruption", "GenerationRace", "ForgedTenant", "EngineRefusal", "StuckRevocation",
           "DropRankReceipt", "CoTenantLoad", "UlpNoise"]
