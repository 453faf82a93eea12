"""Safe-point density (worker side): finer safe points inside long steps while revisions are arriving.

Invariants:
- An armed step runs one of two tiers of in-step safe points (attention query slices and MLP row slices; both
  bit-identical to the unsplit step: retire/slicing.py, retire/mlp_split.py):
  - the static tier: slices in steps of at least `min_tokens` tokens, `rows` tokens per slice (the engine options
    `safe_point_slice_min_tokens` / `safe_point_slice_rows`, 8192 / 1024 unless set);
  - the fine tier (`fine`, 2048 / 512 unless set): never coarser than the static one (the smaller of each).
- A step runs the fine tier iff a revocation was posted within the last `window_s` seconds when the step starts
  (the mailbox's last-post time on CLOCK_MONOTONIC, one clock for every process of the host). Serving with no
  revision therefore never runs the fine tier and pays nothing for it; while revisions arrive, a FENCE waits for the
  next safe point of the finer grid. `window_s = 0` turns the adaptation off (the static tier always).
- The choice is made once per step, at its start: a revision that lands inside a running step finds the tier that
  step started with; the steps after it run fine.
- The tier changes only where the slices are cut, never what is computed: the MLP split of a tier runs only for a
  row count that passed the install-time self-check (`MlpSplitter.verdict_for`).
"""
from __future__ import annotations

from dataclasses import dataclass

#: the static tier unless the engine options set it: slices from 8192-token steps, 1024 tokens per slice
STATIC = (8192, 1024)
#: the fine tier: attention and MLP slices from 2048-token steps, 512 tokens per slice (the long replay's cleanup
#: target needs it: docs/infence.md)
FINE = (2048, 512)
#: a scope revised in the last 30 s is likely to be revised again (the recorded agent trace's bursts): keep the fine
#: tier on while revisions are less than this apart
DEFAULT_WINDOW_S = 30.0


@dataclass(frozen=True)
class Density:
    """The adaptation rule (pure): which tier a step starting at `now_ns` runs."""
    window_s: float = DEFAULT_WINDOW_S
    fine: tuple[int, int] = FINE

    def __post_init__(self):
        if not self.window_s >= 0:
            raise ValueError(f"safe-point revision window must be >= 0 s, got {self.window_s!r}")
        if len(self.fine) != 2 or min(self.fine) < 1:
            raise ValueError(f"fine safe-point tier must be (min_tokens >= 1, rows >= 1), got {self.fine!r}")

    def tier(self, *, static: tuple[int, int], last_post_ns: int, now_ns: int) -> tuple[int, int, str]:
        """(min_tokens, rows, name) for a step starting at `now_ns`, the last revocation posted at `last_post_ns`
        (0: never). `static` is the static tier's (min_tokens, rows)."""
        recent = self.window_s > 0 and last_post_ns > 0 and now_ns - last_post_ns <= self.window_s * 1e9
        if not recent:
            return int(static[0]), int(static[1]), "static"
        return (*self.fine_for(static), "fine")

    def fine_for(self, static: tuple[int, int]) -> tuple[int, int]:
        """The fine tier's (min_tokens, rows) beside the static tier `static`: never coarser (the smaller of each)."""
        return min(int(self.fine[0]), int(static[0])), min(int(self.fine[1]), int(static[1]))

    def with_(self, *, window_s: float | None = None, fine=None) -> "Density":
        """This rule with `window_s` and/or `fine` replaced (None keeps the value); validated like a new one."""
        return Density(window_s=self.window_s if window_s is None else float(window_s),
                       fine=self.fine if fine is None else tuple(int(x) for x in fine))

    def report(self) -> dict:
        return {"window_s": self.window_s, "fine_min_tokens": self.fine[0], "fine_rows": self.fine[1]}
