"""Data that crosses module and process boundaries, defined once.

Invariant: `Contract`, `Certificate` and `Receipt` are frozen; a certificate names exactly the physical blocks (per KV
group) and their generations that the successor may adopt, and nothing else. `Transition` is the one mutable record:
the engine fills `successor_ttft` (and, for native-prefix, `inherited_tokens`) when the successor's first frame is
dequeued.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

MODES = ("tolerant", "exact")
MODE_ALIASES = {"ordinary": "tolerant"}


@dataclass(frozen=True)
class Contract:
    """When inherited state is acceptable.

    - `mode`: "tolerant" (alias "ordinary"): the successor is judged by the logprob-closeness rule against its
      mode-matched reference; "exact": certify only lengths aligned to the prefill chunk so the successor's execution
      shape equals a cold run's, and require bit-identical output.
    - `inherit`: False forces a cold successor.
    - `pin_quota_blocks`: the tenant's handoff-pin quota in blocks (all KV groups counted); None = unlimited, 0 = cold.
    - `dram_tier`: return capacity through the host DRAM tier (retire/dram.py): certified pages are copied to host
      memory and their blocks released; the successor is restored into fresh blocks with digest and epoch checks.
    - `digests`: record per-page digests in the certificate (costs one worker round trip).
    """

    mode: str = "tolerant"
    inherit: bool = True
    pin_quota_blocks: int | None = None
    dram_tier: bool = False
    digests: bool = False

    def normalized(self) -> "Contract":
        mode = MODE_ALIASES.get(self.mode, self.mode)
        return Contract(mode, self.inherit, self.pin_quota_blocks, self.dram_tier, self.digests)

    def to_wire(self) -> dict:
        return asdict(self.normalized())


@dataclass(frozen=True)
class Frame:
    """One dequeued unit of one version's output. A revoked version's stream ends with an empty
    `Frame(revoked=True, finished=True)`."""

    scope: str
    epoch: int
    token_ids: tuple[int, ...]
    finished: bool
    revoked: bool = False
    logprobs: tuple[float, ...] | None = None  # logprob of each sampled token, when requested
    num_cached_tokens: int | None = None
    top_logprobs: tuple[dict[int, float], ...] | None = None  # per token: {token id: logprob} of the top-k


@dataclass(frozen=True)
class Receipt:
    """A participant's acknowledgement that it launches no more work for `epoch`, with its writer frontier
    (tokens whose KV writes completed). `path` says how the writer was closed: "step-boundary" or "safe-point"."""

    participant: str
    epoch: int
    frontier: int
    path: str = "step-boundary"
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Certificate:
    """ALIGN's output: the certified token range [0, tokens) and the blocks that hold it."""

    scope: str
    tenant: str
    from_epoch: int
    to_epoch: int
    tokens: int
    lcp: int
    frontier: int
    block_ids: tuple[tuple[int, ...], ...]  # per KV group
    generations: tuple[tuple[int, ...], ...]  # per KV group, same shape
    fingerprint: str
    mode: str
    digests: tuple[str, ...] | None = None

    @classmethod
    def from_wire(cls, d: dict | None) -> "Certificate | None":
        if not d:
            return None
        d = dict(d)
        d["block_ids"] = tuple(tuple(g) for g in d["block_ids"])
        d["generations"] = tuple(tuple(g) for g in d["generations"])
        if d.get("digests") is not None:
            d["digests"] = tuple(d["digests"])
        return cls(**d)


@dataclass
class Transition:
    """What one SUPERSEDE did. `timings` maps stage -> seconds ("advance", "fence", "align", "pin", "reclaim",
    "resume", "admit"); `fence_latency` is ADVANCE -> last old writer closed."""

    scope: str
    epoch: int
    policy: str
    inherited_tokens: int | None
    certificate: Certificate | None
    cold_reason: str | None
    timings: dict[str, float]
    receipts: tuple[Receipt, ...] = ()
    fence_latency: float | None = None
    successor_ttft: float | None = None
    t_call: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
