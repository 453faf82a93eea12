"""The DRAM tier's worker half: a host-side page store in the worker process, keyed by the certificate's version.

Invariant: a page is the bytes of one physical block in every attention layer, copied as opaque bytes (the
intra-block layout is ISA-specific); its digest is sha256 over those bytes, layer by layer, taken without a copy.
`get` writes the saved pages into the destination blocks and returns the digests of what it wrote, so the frontend
can compare them with the offload digests before the engine installs anything.
"""
from __future__ import annotations

import hashlib
from typing import Any


class DramTier:
    """Host-side page store in the worker process: key -> per page, per layer, a CPU copy of the block."""

    def __init__(self) -> None:
        self.entries: dict[str, list[list[Any]]] = {}

    @staticmethod
    def digest(layers) -> str:
        import torch
        h = hashlib.sha256()
        for t in layers:
            h.update(t.contiguous().view(-1).view(torch.uint8).numpy())  # buffer protocol: no copy
        return h.hexdigest()

    def put(self, key: str, kvs, block_ids: list[int]) -> list[str]:
        if key in self.entries:
            raise KeyError(f"DRAM entry {key!r} already exists")
        pages = [[kv[b].clone() for kv in kvs] for b in block_ids]
        self.entries[key] = pages
        return [self.digest(p) for p in pages]

    def get(self, key: str, kvs, block_ids: list[int]) -> list[str]:
        pages = self.entries[key]
        if len(pages) != len(block_ids):
            raise ValueError(f"DRAM entry {key!r} has {len(pages)} pages, restore asked for {len(block_ids)}")
        for page, b in zip(pages, block_ids):
            for kv, t in zip(kvs, page):
                kv[b].copy_(t)
        return [self.digest([kv[b] for kv in kvs]) for b in block_ids]

    def corrupt(self, key: str, page: int) -> bool:
        import torch
        pages = self.entries.get(key)
        if pages is None:
            return False
        for t in pages[page]:
            flat = t.view(-1).view(torch.uint8)
            flat.bitwise_xor_(0xFF)
        return True

    def drop(self, key: str) -> bool:
        return self.entries.pop(key, None) is not None

    def stats(self) -> dict:
        n = sum(t.numel() * t.element_size() for pages in self.entries.values() for p in pages for t in p)
        return {"entries": sorted(self.entries), "bytes": n}
