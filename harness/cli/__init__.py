"""The command line, ``python -m harness <command>`` and the ``verify-parity`` console script:
``main`` parses (every ``--help``), ``setup`` builds what the commands share (registry, profile,
device, the implementations selected), ``commands`` holds each command's body."""
