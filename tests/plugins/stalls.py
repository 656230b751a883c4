"""A verify_accept plugin (``--impl tests.plugins.stalls:STALLS``) that computes what the reference
chain computes and stalls on purpose, so that a test can interrupt a run at a known point
(``tests/test_cli.py``): every call appends a line to the file ``$VP_TEST_CALLS``, and the call after
``$VP_TEST_STALL_AFTER`` calls (default 0) sleeps ten minutes, interruptible."""
from __future__ import annotations

import os
import time

from harness.registry import Impl
from reference.verify_accept import chain


def _stalling(**inputs):
    path = os.environ["VP_TEST_CALLS"]
    with open(path, "a") as fh:
        fh.write("call\n")
    with open(path) as fh:
        calls = len(fh.readlines())
    if calls > int(os.environ.get("VP_TEST_STALL_AFTER", "0")):
        time.sleep(600)
    return chain.verify_accept(**inputs)


STALLS = Impl("verify_accept", "stalls", "external", _stalling,
              doc="the reference chain, stalling after $VP_TEST_STALL_AFTER calls (tests only)")
