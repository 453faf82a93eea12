"""Safe points inside the MLP of long prefill steps (worker side): one step's MLP runs as row slices.

Invariants:
- The MLP is position-wise: row i of its output is a function of row i of its input alone. Splitting the rows
  changes only the M of its GEMMs, and whether that stays bit-identical is the kernel's business (oneDNN's prepacked
  matmul, the sgl kernel, torch's linear). So the install-time self-check (`selfcheck`) runs this model's own MLP
  modules (the first of each class) on random rows of their input width, whole and in row slices, once for EVERY row
  count a step may use (the static one and the fine tier's: retire/density.py), and a step splits at a row count
  only if its check found every module `torch.equal`; otherwise that verdict carries the largest difference, a fine
  tier falls back to the static row count (`usable_rows`), and where that is inexact too the MLP runs whole (its
  safe point stays the one before it). Some kernels are exact only at some row counts (oneDNN with AMX: 64 and
  768-2048 rows exact, 128-512 not, on the `long` model).
- Splitting runs only inside an armed step of at least `min_tokens` scheduled tokens, and only for an input of at
  least two slices. Slices are contiguous row ranges of `rows` rows, run in order, and concatenated: the MLP's output
  has the unsplit shape and (by the self-check) its values. Between two slices the worker calls `check(layer,
  fraction of the layer's MLP done)`: a safe point, which may cut the step by raising (retire/safepoints.py).
- Nothing is left installed after the step (`disarm`); `enabled = False` runs the unsplit reference.
"""
from __future__ import annotations

import logging

from . import adapter

log = logging.getLogger("retire.mlp_split")


class MlpSplitter:
    def __init__(self, worker, mlps: list, *, min_tokens: int = 8192, rows: int = 1024):
        self.wk = adapter.worker()
        self.mlps = list(mlps)
        self.min_tokens, self.rows = int(min_tokens), int(rows)
        self.enabled = True              # test switch: False runs the unsplit reference
        self.check = None                # safe point between slices: check(layer, fraction)
        self.split_calls = 0
        self._worker = worker
        self.verdicts: dict[int, dict] = {}  # self-check verdict per row count (`verdict_for`)
        self.verdict_for(self.rows)
        self._rows = self.rows               # the row count of the armed step (`arm`)

    @property
    def verdict(self) -> dict:
        """The self-check verdict of the static row count."""
        return self.verdicts.get(self.rows, {})

    @verdict.setter
    def verdict(self, v: dict) -> None:
        self.verdicts[self.rows] = v

    def verdict_for(self, rows: int) -> dict:
        """The install-time self-check for slices of `rows` rows, run once per row count."""
        rows = int(rows)
        if rows not in self.verdicts:
            self.verdicts[rows] = self._verdict(self._worker, rows)
        return self.verdicts[rows]

    def set_rows(self, rows: int) -> dict:
        """Make `rows` the static row count; its own self-check governs the split from now on."""
        self.rows = int(rows)
        return self.verdict_for(self.rows)

    def _verdict(self, worker, rows: int) -> dict:
        mods = [m for m in self.mlps if m is not None]
        if len(mods) != len(self.mlps) or not mods:
            return {"exact": False, "reason": "a decoder layer has no `mlp` module: MLP safe points only"}
        import torch
        dtype = next(self.wk.runner(worker).model.parameters()).dtype
        hidden = self.wk.hidden_size(worker)
        first = {}
        for m in mods:  # one check per MLP class (a model may mix dense and expert layers)
            first.setdefault(type(m), m)
        v = {"exact": True}
        for m in first.values():
            v = dict(selfcheck(m, hidden, dtype, rows), module=type(m).__name__)
            if not v["exact"]:
                break
        if not v["exact"]:
            log.warning("retire: row-split MLP is not bit-identical on this kernel at %d rows (%s); the MLP runs "
                        "whole", rows, v.get("reason"))
        return dict(v, dtype=str(dtype), threads=torch.get_num_threads())

    def usable_rows(self, rows: int) -> int:
        """`rows` if its self-check passed, else the static row count (a tier whose row count is inexact on this
        kernel still splits, at the static rows, whose own verdict `active` then applies)."""
        rows = int(rows)
        return rows if self.verdicts.get(rows, {}).get("exact", False) else self.rows

    def active(self, total_tokens: int, min_tokens: int | None = None, rows: int | None = None) -> bool:
        """Whether a step of `total_tokens` splits its MLP, at `min_tokens` / `rows` (default: the static ones).
        A row count whose self-check has not run (or failed) never splits."""
        v = self.verdicts.get(self.rows if rows is None else int(rows), {})
        lo = self.min_tokens if min_tokens is None else int(min_tokens)
        return self.enabled and v.get("exact", False) and total_tokens >= lo

    def arm(self, check, rows: int | None = None) -> list:
        self.check = check
        self._rows = self.rows if rows is None else int(rows)
        return [self.wk.wrap_forward(m, self._forward_for(i)) for i, m in enumerate(self.mlps)]

    def disarm(self, undo: list) -> None:
        for u in undo:
            u()
        self.check = None

    def _forward_for(self, layer_idx: int):
        def forward(orig, x, *args, **kwargs):
            n = int(x.shape[0])
            rows = self._rows
            if args or kwargs or x.dim() != 2 or n < 2 * rows:
                return orig(x, *args, **kwargs)
            import torch
            outs = []
            for lo in range(0, n, rows):
                if lo:
                    self.check(layer_idx, lo / n)
                outs.append(orig(x[lo:lo + rows]))
            self.split_calls += 1
            return torch.cat(outs)
        return forward


def selfcheck(mlp, hidden: int, dtype, rows: int, n_slices: int = 4, seed: int = 0) -> dict:
    """Run `mlp` whole and in row slices of `rows` rows (`n_slices` of them, the last one short) on the same random
    input; `exact` iff every output element is equal. Reports the largest difference otherwise."""
    import torch

    g = torch.Generator().manual_seed(seed)
    n = rows * n_slices - rows // 3
    x = torch.randn(n, hidden, generator=g).to(dtype)
    with torch.inference_mode():
        full = mlp(x)
        split = torch.cat([mlp(x[lo:lo + rows]) for lo in range(0, n, rows)])
    exact = bool(full.shape == split.shape and torch.equal(full, split))
    diff = float("inf") if full.shape != split.shape else (full.float() - split.float()).abs().max().item()
    return {"exact": exact, "rows": rows, "slices": -(-n // rows), "max_abs_diff": 0.0 if exact else diff,
            "reason": None if exact else f"row-split MLP differs from the whole one by up to {diff:g}"}
