"""``python -m retire.traces`` -> :func:`retire.traces.cli.main`."""
import sys

from .cli import main

sys.exit(main())
