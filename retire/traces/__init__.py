"""Trace tooling: extract supersession transitions from agent session logs, find the
densest window, synthesize a trace fit to the paper's statistics, and read/write the
replay format.

Every function works on the canonical transition frame
``DataFrame[scope: str, time: datetime64[ns, UTC]]`` sorted by time.  Modules:

* :mod:`.extract` -- ``extract_transitions`` and ``ExtractReport``
* :mod:`.window`  -- ``densest_window`` and ``WindowStats``
* :mod:`.synth`   -- ``synthesize`` and ``PAPER`` targets
* :mod:`.replay`  -- ``write_trace_jsonl``, ``read_trace_jsonl``, ``window_to_replay``
* :mod:`.cli`     -- ``main`` (``python -m retire.traces``)

No vllm/torch imports: this package depends only on the stdlib, numpy and pandas.
"""
from .cli import main
from .extract import (
    KNOWN_EVENT_TYPES,
    KNOWN_TOP_TYPES,
    ExtractReport,
    extract_transitions,
    transitions_frame,
)
from .replay import read_trace_jsonl, window_to_replay, write_trace_jsonl
from .synth import PAPER, Targets, synthesize, write_synth_window
from .window import WindowStats, burst_sizes, densest_window, inter_arrival_cv

__all__ = [
    "ExtractReport", "KNOWN_EVENT_TYPES", "KNOWN_TOP_TYPES", "PAPER", "Targets", "WindowStats",
    "burst_sizes", "densest_window", "extract_transitions", "inter_arrival_cv", "main",
    "read_trace_jsonl", "synthesize", "transitions_frame", "window_to_replay",
    "write_synth_window", "write_trace_jsonl",
]
