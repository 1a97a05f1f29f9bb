"""Child programs that mostly wait (decodes aborted after sleeping callbacks) run beside the
other tests instead of holding a test worker idle: one process of the run starts each when the
tests are collected, and the test that needs it reads what it printed when it runs. A test asks for its jobs with
``@pytest.mark.background(JOB, ...)``; ``tests/conftest.py`` starts the jobs of the selected
tests (in a parallel run, the first worker does) and runs those tests last.

Each job runs under ``python background.py FOLDER TIMEOUT COMMAND...``, which forks (the
starting process waits only for the parent, which exits at once), runs the command
(with every CPU the machine lends and none of a test worker's settings), kills it at ``TIMEOUT``
seconds, and writes its output and exit status to ``FOLDER``: the status last, by a rename, so a
reader that finds it finds the job ended. A job outlives the worker that started it (another
worker may run its test), and ends by itself at its timeout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

#: The marker that ties a test to the jobs it reads.
MARKER = "background"


@dataclass(frozen=True)
class Job:
    """A child program's command line (run from the ``tests/`` folder), bounded by ``seconds``."""

    name: str
    command: tuple[str, ...]
    seconds: float


@dataclass(frozen=True)
class Ended:
    """What a job printed, and how it ended (-9: killed at its timeout)."""

    returncode: int
    stdout: str
    stderr: str


TESTS = Path(__file__).resolve().parents[1]


def folder(run: str) -> Path:
    """Where the jobs of the run ``run`` write."""
    return Path(tempfile.gettempdir()) / f"llamactx-background-{run}"


#: This run's id and folder: every worker of a parallel run (pytest-xdist) names the same.
RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID", uuid.uuid4().hex)
FOLDER = folder(RUN)


def start(job: Job) -> None:
    """Starts ``job``; returns at once."""
    where = FOLDER / job.name
    where.mkdir(parents=True)
    subprocess.run(
        [sys.executable, __file__, str(where), str(job.seconds), *job.command],
        cwd=TESTS,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )


def ended(job: Job) -> Ended:
    """Waits for ``job`` (started by this run, perhaps by another worker) to end; a little past the
    job's own timeout, it is taken as lost (its runner killed)."""
    where = FOLDER / job.name
    status = where / "returncode"
    give_up = time.monotonic() + job.seconds + 60
    while not status.exists():
        if time.monotonic() > give_up:
            return Ended(-1, "", f"the background job {job.name} did not report within {job.seconds + 60:.0f} s")
        time.sleep(0.5)
    return Ended(int(status.read_text()), (where / "stdout").read_text(), (where / "stderr").read_text())


def remove(run: str) -> None:
    """Removes the files of the run ``run`` (the process that scheduled its tests does, at the
    end: under ``pytest -n --dist load`` each worker running a module's tests reads its jobs)."""
    shutil.rmtree(folder(run), ignore_errors=True)


def _run(where: Path, seconds: float, command: list[str]) -> None:
    # Not a test worker: every CPU, and none of the worker's settings (tests/conftest.py).
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    environment = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_XDIST_")}
    with (where / "stdout").open("w") as stdout, (where / "stderr").open("w") as stderr:
        try:
            returncode = subprocess.run(
                command, stdout=stdout, stderr=stderr, env=environment, timeout=seconds, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            returncode = -9
    (where / "returncode.tmp").write_text(str(returncode))
    (where / "returncode.tmp").rename(where / "returncode")


if __name__ == "__main__":
    # The starting process waits only for this one, which leaves the job to a child of its own.
    if os.fork() != 0:
        sys.exit(0)
    _run(Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3:])
