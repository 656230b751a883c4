"""Known-failure ledgers of third-party kernels, one module per vendor (``LEDGER``); see harness/ledger.py."""
