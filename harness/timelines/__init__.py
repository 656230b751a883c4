"""Store-timing timelines (``python -m harness timelines``): ``runner`` lives a path under test
through a timeline against the logical KV truth (``truth``), step by step; ``path`` is the path (the
implementations per op and the backend), ``prepare`` the prepare-step adapter API an op implements
(``cases/<op>/prepare.py``), ``launches`` the attention and acceptance calls, ``suite`` the command."""
