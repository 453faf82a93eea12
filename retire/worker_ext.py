"""Worker-side KV access, mixed into vLLM's worker through `worker_extension_cls` and reached by `collective_rpc`.

Invariant: these methods read or write whole physical blocks as opaque bytes across every attention layer's KV
tensor (the intra-block layout is ISA-specific), and never touch scheduler state. A digest is sha256 over the block's
bytes in every layer, in layer order. Oracles and faults use them; the control plane never trusts them for decisions.
"""
from __future__ import annotations

import hashlib


class RetireWorkerExtension:
    def _retire_kv(self):
        from . import adapter
        return adapter.worker().kv_caches(self)

    def retire_block_digests(self, block_ids: list[int]) -> list[str]:
        kvs = self._retire_kv()
        out = []
        for b in block_ids:
            h = hashlib.sha256()
            for kv in kvs:
                h.update(kv[b].contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
            out.append(h.hexdigest())
        return out

    def retire_read_block(self, block_id: int) -> list[bytes]:
        import torch
        return [kv[block_id].contiguous().view(-1).view(torch.uint8).numpy().tobytes() for kv in self._retire_kv()]

    def retire_write_block(self, block_id: int, layers: list[bytes]) -> bool:
        import torch
        kvs = self._retire_kv()
        if len(layers) != len(kvs):
            raise ValueError(f"expected {len(kvs)} layers, got {len(layers)}")
        for kv, data in zip(kvs, layers):
            dst = kv[block_id]
            src = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dst.dtype).view(dst.shape)
            dst.copy_(src)
        return True

    def retire_xor_block(self, block_id: int, layer: int = -1) -> bool:
        """Flip every bit of one block (in one layer, or all layers when layer == -1): the page-corruption fault."""
        import torch
        kvs = self._retire_kv()
        targets = kvs if layer == -1 else [kvs[layer]]
        for kv in targets:
            blk = kv[block_id]
            flipped = (blk.contiguous().view(-1).view(torch.uint8) ^ 0xFF).view(blk.dtype).view(blk.shape)
            blk.copy_(flipped)
        return True

    # DRAM tier (retire/dram/): a host-side page store in this worker process, keyed by the handoff's version.
    def _retire_dram(self):
        tier = getattr(self, "_retire_dram_tier", None)
        if tier is None:
            from .dram.worker import DramTier
            tier = self._retire_dram_tier = DramTier()
        return tier

    def retire_dram_put(self, key: str, block_ids: list[int]) -> list[str]:
        """Copy the blocks' bytes (every layer) into the tier under `key`; returns one digest per page."""
        return self._retire_dram().put(key, self._retire_kv(), [int(b) for b in block_ids])

    def retire_dram_get(self, key: str, block_ids: list[int]) -> list[str]:
        """Write the saved pages of `key` into `block_ids`; returns the digests of the blocks as written."""
        return self._retire_dram().get(key, self._retire_kv(), [int(b) for b in block_ids])

    def retire_dram_corrupt(self, key: str, page: int) -> bool:
        """Flip every bit of one saved page (all layers): the DRAM page-corruption fault (an involution)."""
        return self._retire_dram().corrupt(key, int(page))

    def retire_dram_drop(self, key: str) -> bool:
        return self._retire_dram().drop(key)

    def retire_dram_stats(self) -> dict:
        return self._retire_dram().stats()

    def retire_kv_info(self) -> dict:
        kvs = self._retire_kv()
        return {"layers": len(kvs), "shape": list(kvs[0].shape), "dtype": str(kvs[0].dtype)}

    def retire_install_receipts(self) -> dict:
        """Attach this rank's step acknowledgements (retire/participants.py) to the step wrapper when the engine runs
        several ranks (idempotent). Returns {rank, active}."""
        from . import adapter
        from .participants import RankLedger, RankRecorder
        from .worker_step import StepWrapper

        wrapper = StepWrapper.of(self)
        if wrapper.receipts is None:
            ledger = RankLedger.from_env()
            if ledger is None:
                return {"rank": adapter.worker().rank(self), "active": False}
            wrapper.attach(receipts=RankRecorder(self, ledger))
        return {"rank": wrapper.receipts.rank, "active": True}

    def retire_drop_receipt(self, rank: int, dropped: bool) -> bool:
        """DropRankReceipt fault seam: rank `rank` stops (or resumes) acknowledging steps. True on that rank."""
        rec = getattr(getattr(self, "_retire_step", None), "receipts", None)
        if rec is None or rec.rank != int(rank):
            return False
        rec.dropped = bool(dropped)
        return True

    def retire_install_safe_points(self, min_tokens: int, block: int, window_s: float | None = None,
                                   fine: tuple[int, int] | None = None, release_heap: bool = True) -> dict:
        """Attach per-layer safe points to the step wrapper (idempotent). Returns whether they are active.
        The first install runs the slicing self-checks, then returns the free heap they leave to the kernel
        (retire/heap.py; `release_heap=False` keeps it: the negative control of that check).
        Not with several ranks: each rank would read the mailbox at its own moment and could cut at another layer
        than its peers, leaving them blocked in a collective; those engines FENCE at the step boundary."""
        from . import adapter
        from .worker_step import StepWrapper

        receipts = self.retire_install_receipts()
        world = adapter.worker().world_size(self)
        if world > 1:
            return {"active": False, "layers": 0, "min_tokens": int(min_tokens), "receipts": receipts,
                    "reason": f"{world} worker ranks: in-step cuts must be collective; step-boundary FENCE"}
        wrapper = StepWrapper.of(self)
        sp = wrapper.safe_points or getattr(self, "_retire_safe_points", None)
        if sp is None:
            from .density import Density
            from .mailbox import Mailbox
            from .safepoints import SafePoints
            mb = Mailbox.from_env()
            if mb is None:
                return {"active": False, "reason": "no revocation mailbox in this worker's environment"}
            density = Density().with_(window_s=window_s, fine=fine)
            sp = self._retire_safe_points = SafePoints(self, mb, min_tokens, block, density=density)
            sp.install(wrapper)
            if release_heap:
                from .heap import release
                sp.heap = release()
        elif window_s is not None or fine is not None:
            sp.set_density(sp.density.with_(window_s=window_s, fine=fine))
        sp.min_tokens = int(min_tokens)
        return {"active": sp.installed, "layers": len(sp.layers), "min_tokens": sp.min_tokens,
                "reason": None if sp.installed else "compiled mode: step-boundary FENCE",
                "slicing": sp.slicer.verdict if sp.slicer is not None else None, "density": sp.density.report(),
                "heap": sp.heap}

    def retire_slicing(self, enabled: bool | None = None, min_tokens: int | None = None,
                       rows: int | None = None, window_s: float | None = None,
                       fine: tuple[int, int] | None = None) -> dict:
        """Sliced attention and row-split MLP (retire/slicing.py, retire/mlp_split.py): switch them on/off (the
        unsliced reference run), set the static tier (the step size they start at, the tokens per slice) and the
        density rule (retire/density.py), and report."""
        from .slicing import control
        return control(self, enabled, min_tokens=min_tokens, rows=rows, window_s=window_s, fine=fine)

    def retire_logits_probe(self, on: bool) -> list[str]:
        """Test probe: record a digest of every logits tensor (on); stop and return the digests (off)."""
        from .slicing import logits_probe
        return logits_probe(self, on)
