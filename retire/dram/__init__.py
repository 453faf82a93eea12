"""The DRAM tier (paper Table 12): the capacity-returning handoff path, split by the process each half runs in.

- `retire.dram.engine`: every handoff's state in the scheduler (EngineCore process), over the KV port.
- `retire.dram.worker`: the host-side page store in the worker process.
- `retire.dram.frontend`: the copy-out and restore orchestration (frontend process), and the `HoldRestore` barrier.

vLLM's own offloading connectors refuse CPU, so the tier is ours: certified pages are copied out of the worker's KV
tensors, their blocks go back to the allocator, and the successor is restored into fresh blocks when it is admitted.
"""
from .frontend import HoldRestore, Transfer, pending_transition, restore

__all__ = ["HoldRestore", "Transfer", "pending_transition", "restore"]
