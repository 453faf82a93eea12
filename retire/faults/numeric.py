"""Numerical faults on KV pages, through the worker extension's read/write RPCs.

- UlpNoise(block_ids): flips the least significant bit of every element of the named physical blocks, in every layer:
  each KV value moves by one unit in the last place, the size of the rounding difference a different execution shape
  can produce. A bit-identity check must see it; a tolerance rule is expected not to. Heal writes the saved bytes
  back (digests return to their pre-fault values).
"""
from __future__ import annotations

from .kv import PageCorruption

_ELEM = {"torch.bfloat16": 2, "torch.float16": 2, "torch.float32": 4, "torch.float8_e4m3fn": 1,
         "torch.float8_e5m2": 1, "torch.uint8": 1}


class UlpNoise(PageCorruption):
    """PageCorruption's save/heal, with a smaller break: every KV element of the pages moves by one unit in the last
    place (the mantissa LSB flips), the least change a bit-identity check must still see."""

    name = "ulp-noise"

    async def _mutate(self, be) -> None:
        info = (await be.worker("retire_kv_info"))[0]
        step = _ELEM.get(info["dtype"])
        if step is None:
            raise ValueError(f"UlpNoise: unknown KV dtype {info['dtype']}")
        for b, layers in self.saved.items():
            noisy = []
            for data in layers:
                buf = bytearray(data)
                for i in range(0, len(buf), step):  # little endian: byte 0 of an element holds its mantissa LSB
                    buf[i] ^= 1
                noisy.append(bytes(buf))
            await be.worker("retire_write_block", b, noisy)
