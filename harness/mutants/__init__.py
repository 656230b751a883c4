"""``python -m harness mutants``: the kill matrix (``killmatrix``: every mutant x check family,
and the clean implementations on the same targeted runs) and what the command reports (``kills``).
The mutants themselves are data: ``cases/<op>/mutants.py`` and ``cases/mutants/``."""
