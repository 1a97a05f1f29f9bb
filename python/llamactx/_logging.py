"""Turning llamactx's log on and off without configuring logging by hand."""

from __future__ import annotations

import logging
import sys

__all__ = ["set_verbose"]

LOGGER = logging.getLogger("llamactx")
_HANDLER_NAME = "llamactx.verbose"


def set_verbose(verbose: bool = True, *, level: int = logging.INFO) -> None:
    """Shows llama.cpp's and llamactx's log on stderr (``verbose=True``, from ``level`` up) or
    stops showing it. Without this, the ``llamactx`` logger follows the application's
    ``logging`` configuration and is silent if there is none."""
    for handler in [h for h in LOGGER.handlers if h.get_name() == _HANDLER_NAME]:
        LOGGER.removeHandler(handler)
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        LOGGER.addHandler(handler)
        LOGGER.setLevel(level)
    else:
        LOGGER.setLevel(logging.NOTSET)
