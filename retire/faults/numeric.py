"""Numerical faults on KV pages, through the worker extension's read/write RPCs.

- UlpNoise(block_ids): flips the least significant bit of every element of the named physical blocks, in every layer:
  each KV value moves by one unit in the last place, the size of the rounding difference a different execution shape
  can produce. A bit-identity check must see it; a tolerance rule is expected not to. Heal writes the saved bytes
  back (digests return to their pre-fault values).
"""
from __future__ import annotations

from .base import Fault

_ELEM = {"torch.bfloat16": 2, "torch.float16": 2, "torch.float32": 4, "torch.float8_e4m3fn": 1,
         "torch.float8_e5m2": 1, "torch.uint8": 1}


class UlpNoise(Fault):
    name = "ulp-noise"
    affects = frozenset({"kv.page"})

    def __init__(self, block_ids: list[int]):
        super().__init__()
        self.block_ids = [int(b) for b in block_ids]
        self.saved: dict[int, list[bytes]] = {}

    async def inject(self, target) -> None:
        be = target.backend
        info = (await be.worker("retire_kv_info"))[0]
        step = _ELEM.get(info["dtype"])
        if step is None:
            raise ValueError(f"UlpNoise: unknown KV dtype {info['dtype']}")
        for b in self.block_ids:
            self.saved[b] = (await be.worker("retire_read_block", b))[0]
        await super().inject(target)  # injected before mutating: heal restores even if a write fails midway
        for b, layers in self.saved.items():
            noisy = []
            for data in layers:
                buf = bytearray(data)
                for i in range(0, len(buf), step):  # little endian: byte 0 of an element holds its mantissa LSB
                    buf[i] ^= 1
                noisy.append(bytes(buf))
            await be.worker("retire_write_block", b, noisy)

    async def heal(self) -> None:
        be = self.target.backend
        for b, layers in self.saved.items():
            await be.worker("retire_write_block", b, layers)
        await super().heal()
