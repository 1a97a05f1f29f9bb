"""Which server the suite runs against, and the marks of what llamactx does otherwise than
llama-server: expected failures on llamactx only, each with its reason (strict: a test that starts
passing must lose its mark)."""

from __future__ import annotations

import os

import pytest

#: A Python with ``xllamacpp`` installed: the suite then runs against llama.cpp's server.
PEER_PYTHON = "LLAMACTX_SUITE_PEER_PYTHON"
#: The server under test: "llamactx" or "llama-server".
SERVER = "llama-server" if os.environ.get(PEER_PYTHON) else "llamactx"


def llamactx_lacks(reason: str) -> pytest.MarkDecorator:
    """A feature llamactx deliberately lacks (or does not have yet): fails there, on purpose."""
    return pytest.mark.xfail(SERVER == "llamactx", reason=f"llamactx lacks {reason}", strict=True)
