"""Prints which of numpy and llamactx ``import llamactx`` loads (see test_import.py)."""

import sys

import llamactx  # noqa: F401  (the import is what this program measures)

print(sorted(name for name in ("numpy", "llamactx") if name in sys.modules))
