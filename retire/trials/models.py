"""Tiny deterministic models, written locally by transformers and cached.

Invariant: a model directory is a pure function of its spec (architecture, shape, init std, seed). The cache folder
is keyed by a hash of the spec, written to a temporary folder and renamed into place under a file lock, so parallel
runs never see a half-written model. Nothing is downloaded: prompts are token ids and the engine runs with
`skip_tokenizer_init=True`.

Specs (see RETIRE.md §6):
- `unit`:   Qwen3-shaped, hidden 256 x 4 layers, init std 0.1 (greedy output varies).
- `long`:   Qwen3-shaped, hidden 512 x 8 layers, max_position_embeddings 32768 (the long-prefill model).
- `hybrid`: Gemma3-shaped, sliding window 128 on alternate layers (two KV groups), untied embeddings, init std
            0.2 (std 0.1 collapses to a repeated token after ~10 greedy steps).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from filelock import FileLock

VOCAB = 2048


@dataclass(frozen=True)
class ModelSpec:
    name: str
    arch: str  # "qwen3" | "gemma3"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    max_pos: int
    init_std: float
    seed: int = 0
    vocab: int = VOCAB
    dtype: str = "bfloat16"
    extra: tuple = field(default_factory=tuple)  # (key, value) pairs forwarded to the config

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


SPECS: dict[str, ModelSpec] = {
    "unit": ModelSpec("unit", "qwen3", hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64,
                      intermediate=512, max_pos=4096, init_std=0.1, seed=1),
    "long": ModelSpec("long", "qwen3", hidden=512, layers=8, heads=8, kv_heads=4, head_dim=64,
                      intermediate=1024, max_pos=32768, init_std=0.1, seed=2),
    "hybrid": ModelSpec("hybrid", "gemma3", hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64,
                        intermediate=512, max_pos=4096, init_std=0.2, seed=3,
                        extra=(("sliding_window", 128), ("sliding_window_pattern", 2),
                               ("tie_word_embeddings", False))),
}


def cache_root() -> Path:
    root = os.environ.get("RETIRE_MODEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "retire-models")
    return Path(root)


def _build_config(spec: ModelSpec):
    import transformers

    common = dict(vocab_size=spec.vocab, hidden_size=spec.hidden, num_hidden_layers=spec.layers,
                  num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim,
                  intermediate_size=spec.intermediate, max_position_embeddings=spec.max_pos,
                  initializer_range=spec.init_std, torch_dtype=spec.dtype, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0)
    extra = dict(spec.extra)
    if spec.arch == "qwen3":
        return transformers.Qwen3Config(tie_word_embeddings=False, **common, **extra), transformers.Qwen3ForCausalLM
    if spec.arch == "gemma3":
        pattern = extra.pop("sliding_window_pattern", 2)
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(spec.layers)]
        cfg = transformers.Gemma3TextConfig(layer_types=layer_types, **common, **extra)
        cfg.architectures = ["Gemma3ForCausalLM"]
        return cfg, transformers.Gemma3ForCausalLM
    raise ValueError(f"unknown architecture {spec.arch!r}")


def _write(spec: ModelSpec, dest: Path) -> None:
    import torch

    cfg, cls = _build_config(spec)
    torch.manual_seed(spec.seed)
    model = cls(cfg)
    # EOS must never be sampled by accident: tests ask for exact token counts (ignore_eos is also set).
    model = model.to(getattr(torch, spec.dtype))
    model.save_pretrained(dest, safe_serialization=True)
    (dest / "retire-spec.json").write_text(json.dumps(asdict(spec), sort_keys=True, default=str))


def ensure_model(name: str) -> str:
    """Return the path of the cached model `name`, writing it first if needed (idempotent, race-free)."""
    spec = SPECS[name]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    dest = root / f"{spec.name}-{spec.key()}"
    if (dest / "retire-spec.json").exists():
        return str(dest)
    with FileLock(str(root / f".{spec.name}.lock")):
        if (dest / "retire-spec.json").exists():
            return str(dest)
        tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=root))
        try:
            _write(spec, tmp)
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return str(dest)


def main(argv=None) -> int:
    import sys

    for n in (sys.argv[1:] if argv is None else argv) or list(SPECS):
        print(n, ensure_model(n))
    return 0


if __name__ == "__main__":
    main()
