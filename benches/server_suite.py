"""Our adaptation of llama.cpp's server tests run against llamactx serve and llama-server.

The suite (``tests/server/openai_surface``: chat and legacy completions, embeddings, tool calls, and the
Responses and Anthropic APIs) runs against ``llamactx serve``, then against llama.cpp's own server
(llama-server, run in-process by ``xllamacpp`` from the peer venv), on the same model, context,
slots and threads: each test's outcome on each server, the totals, and why each failure failed.

    python benches/server_suite.py --peer-python .venv-peers/bin/python [--out bench-results]

Prints the table and writes it, with the totals and the reasons, to server_suite.json in --out.
A test llamactx is expected to fail (a feature it lacks, or a bug found and not yet fixed) is
"xfail" in its column, with the reason; llama-server's column has no expectations, only "pass"
and "fail".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "tests" / "server" / "openai_surface"
#: The variable the suite's fixtures read (tests/openai_surface/markers.py): a Python with
#: xllamacpp, whose llama.cpp server they then start instead of ``llamactx serve``.
PEER_PYTHON = "LLAMACTX_SUITE_PEER_PYTHON"
SERVERS = ("llamactx", "llama-server")
OUTCOMES = ("pass", "fail", "xfail", "skip")
#: How much of a failure's message the table keeps.
WHY_CHARACTERS = 300


def run_suite(peer_python: Path | None, junit: Path) -> float:
    """The suite against llama-server (with ``peer_python``) or llamactx (without), its results
    in ``junit``; the seconds it took. Failing tests are results, not errors."""
    environment = {name: value for name, value in os.environ.items() if name != PEER_PYTHON}
    if peer_python is not None:
        environment[PEER_PYTHON] = str(peer_python)
    command = [sys.executable, "-m", "pytest", str(SUITE), "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    began = time.perf_counter()
    finished = subprocess.run(command, cwd=ROOT, env=environment, check=False)
    if not junit.exists():
        raise SystemExit(f"pytest exited with {finished.returncode} and wrote no results")
    return time.perf_counter() - began


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """``{test: (outcome, why)}`` from pytest's JUnit XML: "pass", "fail" (a failure, an error or
    a strict xfail that passed), "xfail" or "skip", and the message of all but a pass."""
    results: dict[str, tuple[str, str]] = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        test = f"{module}.py::{case.get('name')}"
        failed = case.find("failure")
        if failed is None:
            failed = case.find("error")
        skipped = case.find("skipped")
        if failed is not None:
            results[test] = ("fail", failed.get("message", "").strip()[:WHY_CHARACTERS])
        elif skipped is not None:
            kind = "xfail" if skipped.get("type") == "pytest.xfail" else "skip"
            results[test] = (kind, skipped.get("message", "").strip()[:WHY_CHARACTERS])
        else:
            results[test] = ("pass", "")
    return results


def table(by_server: dict[str, dict[str, tuple[str, str]]]) -> list[dict[str, Any]]:
    """A row per test (in the llamactx run's order, then any only the other ran): its outcome
    on each server and, for each outcome other than a pass, why."""
    tests = list(dict.fromkeys(test for results in by_server.values() for test in results))
    rows = []
    for test in tests:
        row: dict[str, Any] = {"test": test}
        why = {}
        for server, results in by_server.items():
            outcome, message = results.get(test, ("missing", ""))
            row[server] = outcome
            if message:
                why[server] = message
        row["why"] = why
        rows.append(row)
    return rows


def totals(results: dict[str, tuple[str, str]]) -> dict[str, int]:
    counts = {outcome: 0 for outcome in OUTCOMES}
    for outcome, _ in results.values():
        counts[outcome] += 1
    return {**counts, "total": len(results)}


def show(rows: list[dict[str, Any]], summary: dict[str, dict[str, int]]) -> None:
    width = max(len(row["test"]) for row in rows)
    print(f"\n{'test':{width}}  {'llamactx':9} llama-server")
    for row in rows:
        print(f"{row['test']:{width}}  {row['llamactx']:9} {row['llama-server']}")
    for server, counts in summary.items():
        print(f"{server}: " + ", ".join(f"{counts[outcome]} {outcome}" for outcome in (*OUTCOMES, "total")))
    print("\nNot passing, and why:")
    for row in rows:
        for server, message in row["why"].items():
            print(f"  {row['test']} [{server}, {row[server]}]: {message.splitlines()[0] if message else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", type=Path, required=True, help="the venv of `make bench-peers`")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    arguments = parser.parse_args()
    arguments.out.mkdir(parents=True, exist_ok=True)
    by_server: dict[str, dict[str, tuple[str, str]]] = {}
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for server, peer in zip(SERVERS, (None, arguments.peer_python), strict=True):
            junit = Path(scratch) / f"{server}.xml"
            seconds[server] = run_suite(peer, junit)
            by_server[server] = outcomes(junit)
    rows = table(by_server)
    summary = {server: totals(results) for server, results in by_server.items()}
    peer_version = subprocess.run(
        [str(arguments.peer_python), "-c", "from importlib.metadata import version; print(version('xllamacpp'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    results = {
        "versions": {"llamactx": version("llamactx"), "xllamacpp": peer_version},
        "seconds": seconds,
        "totals": summary,
        "tests": rows,
    }
    (arguments.out / "server_suite.json").write_text(json.dumps(results, indent=2) + "\n")
    show(rows, summary)


if __name__ == "__main__":
    main()
