"""Known-failure ledgers of third-party kernels, one module per vendor (``LEDGER``: ``harness.ledger.KnownFailure``
entries, or ``KnownFailureOnInputs`` for a failure that depends on the case's data); see harness/ledger.py."""
