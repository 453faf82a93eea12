"""`python -m retire.demo` (= `make run`)."""
import sys

from . import main

sys.exit(main())
