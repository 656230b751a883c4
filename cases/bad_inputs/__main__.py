"""``python -m cases.bad_inputs``: the command line (``cases.bad_inputs.cli``)."""
import sys

from cases.bad_inputs.cli import main

sys.exit(main())
