"""What crosses a process (frontend <-> EngineCore <-> worker), defined once as typed msgspec structs.

Invariants:
- An identity is a typed tuple all the way down: `ScopeKey(namespace, tenant, scope)` and `VersionKey(scope, epoch)`.
  No code joins tenant and scope strings into one key, so no tenant or scope string (whatever it holds: "/", "#",
  unicode, 1,000 characters) can alias another. Where a fixed-size key is needed (shared memory, request ids) it is
  `digest(...)` of the struct's msgpack encoding, never a truncation.
- Every struct that crosses a process is encoded with `encode` and decoded with `decode(raw, Type)`: both ends name
  the type, and a malformed message fails loudly at the boundary (`msgspec.ValidationError`).
- `Contract`, `Certificate` and `Receipt` are frozen; a certificate names exactly the physical blocks (per KV group)
  and their generations that the successor may adopt, and nothing else.
- `Frame` and `Transition` are frontend-only records (public API). `Transition` is the one mutable record: the facade
  fills `successor_ttft` (and, for native-prefix, `inherited_tokens`) when the successor's first frame is dequeued.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

import msgspec

MODES = ("tolerant", "exact")
# The revision slack's default reach behind the writer frontier (tokens): the agent case is "the last user turn
# changes after the model generated a few hundred tokens", i.e. the LCP lies (tokens generated) + (length of the
# replaced last turn) behind the frontier; 1,024 covers up to 512 of each (docs/slack.md).
DEFAULT_SLACK_TOKENS = 1024
MODE_ALIASES = {"ordinary": "tolerant"}
T = TypeVar("T")

_enc = msgspec.msgpack.Encoder()


def encode(obj: Any) -> bytes:
    return _enc.encode(obj)


def decode(raw: bytes, typ: type[T]) -> T:
    return msgspec.msgpack.decode(raw, type=typ)


def digest(obj: Any, size: int = 16) -> bytes:
    """A fixed-size key for a typed identity: sha256 of its msgpack encoding (injective on the typed value)."""
    return hashlib.sha256(_enc.encode(obj)).digest()[:size]


# ------------------------------------------------------------------------------------------------ identities
class ScopeKey(msgspec.Struct, frozen=True, array_like=True):
    """Which scope: the facade's namespace (sibling facades on one engine never share scopes), tenant, scope id."""

    namespace: str
    tenant: str
    scope: str


class VersionKey(msgspec.Struct, frozen=True, array_like=True):
    scope: ScopeKey
    epoch: int

    def request_id(self) -> str:
        """vLLM's external request id for this version: readable epoch, unambiguous digest (vLLM appends its own
        random suffix to make the internal id)."""
        return f"retire-e{self.epoch}-{digest(self).hex()}"


# ------------------------------------------------------------------------------------------------ contract
class Contract(msgspec.Struct, frozen=True, kw_only=True):
    """When inherited state is acceptable.

    - `mode`: "tolerant" (alias "ordinary"): the successor is judged by the logprob-closeness rule against its
      mode-matched reference; "exact": certify only lengths aligned to the prefill chunk so the successor's execution
      shape equals a cold run's, and require bit-identical output.
    - `inherit`: False forces a cold successor.
    - `pin_quota_blocks`: the tenant's handoff-pin quota in blocks (all KV groups counted); None = unlimited, 0 = cold.
    - `dram_tier`: return capacity through the host DRAM tier (retire/dram/): certified pages are copied to host
      memory and their blocks released; the successor is restored into fresh blocks with digest and epoch checks.
    - `digests`: record per-page digests in the certificate (costs one worker round trip).
    - `slack` / `slack_tokens`: the revision slack of the version this contract starts (given to `submit`, or to
      `supersede` for the successor as a future predecessor): its sliding-window KV blocks needed to resume from any
      point in the last `slack_tokens` tokens behind its writer frontier are kept (pinned) although vLLM drops them,
      so a later SUPERSEDE with an LCP that far back still inherits. The kept blocks count against the tenant's pin
      quota (`pin_quota_blocks` of this contract bounds them). No effect on a model without sliding-window groups.
    """

    mode: str = "tolerant"
    inherit: bool = True
    pin_quota_blocks: Optional[int] = None
    dram_tier: bool = False
    digests: bool = False
    slack: bool = False
    slack_tokens: int = DEFAULT_SLACK_TOKENS

    def normalized(self) -> "Contract":
        return msgspec.structs.replace(self, mode=MODE_ALIASES.get(self.mode, self.mode))

    def to_wire(self) -> dict:
        return msgspec.structs.asdict(self.normalized())

    def revision_slack(self) -> "RevisionSlack | None":
        """What the engine must know while the version runs (None: no slack)."""
        return RevisionSlack(int(self.slack_tokens), self.pin_quota_blocks) if self.slack else None


class RevisionSlack(msgspec.Struct, frozen=True, array_like=True):
    """A version's revision slack, carried by its own request (`RequestTag.slack`): keep the sliding-window blocks
    needed to resume from any point in the last `tokens` tokens behind its frontier, within `quota_blocks` pinned
    blocks of its tenant (None: unlimited)."""

    tokens: int
    quota_blocks: Optional[int] = None


# ------------------------------------------------------------------------------------------------ frontend -> engine
class Supersede(msgspec.Struct, frozen=True):
    """SUPERSEDE(scope, expected_epoch -> key.epoch, contract): rides on the successor's ADD. `posted` names the
    request id the frontend revoked in the mailbox before sending (the engine retires that entry, accepted or not)."""

    expected_epoch: int
    contract: Contract
    posted: Optional[str] = None


class RequestTag(msgspec.Struct, frozen=True):
    """Attached to every retire request (`SamplingParams.extra_args["retire"]`, msgpack bytes). `slack` is the
    version's own revision slack (from the contract given to `submit`, or the SUPERSEDE's contract for a successor),
    known to the engine from the version's first step."""

    key: VersionKey
    policy: str
    supersede: Optional[Supersede] = None
    slack: Optional[RevisionSlack] = None

    @property
    def tenant(self) -> str:
        return self.key.scope.tenant


# ------------------------------------------------------------------------------------------------ engine -> frontend
class Receipt(msgspec.Struct, frozen=True):
    """A participant's acknowledgement that it launches no more work for `epoch`, with its writer frontier
    (tokens whose KV writes completed). `path` says how the writer was closed: "step-boundary", "safe-point",
    "finish-step" or "step-boundary:mixed"."""

    participant: str
    epoch: int
    frontier: int
    path: str = "step-boundary"
    detail: dict = {}


class Certificate(msgspec.Struct, frozen=True):
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
    digests: Optional[tuple[str, ...]] = None


class DramHandoff(msgspec.Struct, frozen=True):
    """A certified prefix held for the DRAM tier: source blocks pinned until copy-out; successor held."""

    key: VersionKey
    tokens: int
    src: tuple[tuple[int, ...], ...]
    held_by_test: bool = False


class TransitionResult(msgspec.Struct, frozen=True):
    """The engine's answer to one SUPERSEDE. `refused` set means nothing changed in the engine (no ADVANCE, the
    successor was not admitted). Times are `time.monotonic()` of the engine process (system-wide on Linux)."""

    key: VersionKey
    refused: Optional[str] = None
    refused_kind: Optional[str] = None  # "unknown-scope" | "stale-epoch" | "injected"
    inherited_tokens: int = 0
    certificate: Optional[Certificate] = None
    cold_reason: Optional[str] = None
    receipts: tuple[Receipt, ...] = ()
    timings: dict[str, float] = {}
    t_engine: float = 0.0
    fence_closed_at: Optional[float] = None
    dram: Optional[DramHandoff] = None
    dram_stale: tuple[VersionKey, ...] = ()  # DRAM copies the frontend must drop (their epoch was retired)


# ------------------------------------------------------------------------------------------------ frontend records
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


@dataclass
class Transition:
    """What one SUPERSEDE did. `timings` maps stage -> seconds ("advance", "fence", "align", "pin", "reclaim",
    "resume", "admit"); `fence_latency` is SUPERSEDE call -> last old writer closed."""

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
