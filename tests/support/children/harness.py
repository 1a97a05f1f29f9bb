"""The entry point of the child programs: ``python tests/support/children/PROGRAM.py MODEL_PATH CASE``
loads the model and runs PROGRAM's function named CASE. The tests start these programs in a
fresh interpreter (``conftest.run_child``) for what a test process cannot survive or share: a
crash, a signal, a fork, the process's own threads, memory and stderr."""

from __future__ import annotations

import functools
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import llamactx

Case = Callable[[llamactx.LlamaModel], None]


def answer_ctrl_c() -> None:
    """Makes Ctrl-C raise KeyboardInterrupt, as in an interactive Python. A test run started in
    the background inherits SIGINT ignored from the shell, and Python then leaves it ignored."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def press_ctrl_c_soon(delay: float = 0.5) -> list[float]:
    """Sends this process SIGINT from another thread after ``delay`` seconds; the list it
    returns then holds the ``time.perf_counter()`` of the moment it was sent."""
    sent: list[float] = []

    def press() -> None:
        time.sleep(delay)
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press).start()
    return sent


def run(*cases: Case) -> None:
    """Runs the case named on the command line with the model named there. Several names,
    comma-separated, run one after another, each after a ``CASE name`` line
    (``support.processes.raised_one_after_another``)."""
    answer_ctrl_c()
    model_path, names = sys.argv[1:]
    chosen = {case.__name__: case for case in cases}
    model = llamactx.LlamaModel.load_from_file(model_path)
    if "," not in names:
        chosen[names](model)
        return
    for name in names.split(","):
        print("CASE", name, flush=True)
        chosen[name](model)
        gc.collect()  # what the case left goes before the next starts, as it would at an exit


def reporting(cases: list[Case]) -> Callable[[Case], Case]:
    """A decorator that registers a case in ``cases``, run so that it prints ``RAISED`` and the
    name of the exception it raised (``RAISED none`` if it returned) instead of raising it."""

    def register(run: Case) -> Case:
        @functools.wraps(run)
        def report(model: llamactx.LlamaModel) -> None:
            try:
                run(model)
            except BaseException as error:
                print("RAISED", type(error).__name__, flush=True)
            else:
                print("RAISED none", flush=True)

        cases.append(report)
        return run

    return register
