"""Helpers the tests share (imported as ``support.NAME``; pytest puts ``tests/`` on the path)."""
