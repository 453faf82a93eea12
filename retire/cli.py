"""The `retire` console entry point: `retire demo`, `retire conform [--vllm SPEC] --json OUT`,
`retire seams --vllm SPEC [--json OUT]`, `retire compat FILE...`, `retire report RESULTS.json | --compare OLD NEW`, `retire traces ...`,
`retire serve MODEL [vLLM engine flags] [--policy P] [--api-keys FILE] [--host H --port P]` (docs/serve.md)."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "conform":
        from .conform import main as run
        return run(rest)
    if cmd == "seams":
        from .seamcheck import main as run
        return run(rest)
    if cmd == "compat":
        from .compat import main as run
        return run(rest)
    if cmd == "demo":
        from .demo import main as run
        return run(rest) or 0
    if cmd == "report":
        from .report import main as run
        return run(rest) or 0
    if cmd == "serve":
        from .serve.cli import main as run
        return run(rest) or 0
    if cmd == "traces":
        from .traces.cli import main as run
        return run(rest) or 0
    print(f"unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
