"""The entry point of the child programs: ``python tests/children/PROGRAM.py MODEL_PATH CASE``
loads the model and runs PROGRAM's function named CASE. The tests start these programs in a
fresh interpreter (``conftest.run_child``) for what a test process cannot survive or share: a
crash, a signal, a fork, the process's own threads, memory and stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable

import llamactx

Case = Callable[[llamactx.LlamaModel], None]


def run(*cases: Case) -> None:
    """Runs the case named on the command line with the model named there."""
    model_path, name = sys.argv[1:]
    chosen = {case.__name__: case for case in cases}[name]
    chosen(llamactx.LlamaModel.load_from_file(model_path))
