"""``python -m harness.fuzz``: the command line (``harness.fuzz.cli``)."""
import sys

from harness.fuzz.cli import main

sys.exit(main())
