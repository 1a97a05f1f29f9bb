"""The chat template's work limit where counting allocations is not enough (the third red team's
findings 4 and 5): the limit reached inside code that cannot propagate an exception, string work
that allocates little, memory the C++ runtime allocates where the count cannot see it. Each runs
in a child process (``support/children/template_limits.py``): before, the first ended the process with
``std::terminate``, the second ran for minutes and the third took 2 GB."""

from __future__ import annotations

from pathlib import Path

from support.processes import run_child


def printed(model_path: Path, case: str, timeout: float = 120) -> dict[str, list[str]]:
    """What the child case printed, by the first word of each line; the child must have
    survived."""
    result = run_child(model_path, "template_limits", case, timeout=timeout)
    assert result.returncode == 0, result.stderr[-2000:]
    found: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        word, _, rest = line.partition(" ")
        found.setdefault(word, []).append(rest)
    return found


def test_the_limit_reached_anywhere_in_the_template_analysis_is_an_error(model_path: Path) -> None:
    found = printed(model_path, "work_limit_reached_inside_the_template_analysis", timeout=600)
    outcomes = found["COUNT"]
    assert len(outcomes) == 28
    assert all(outcome.split(" ", 1)[1].startswith(("WorkLimit: ", "parsed")) for outcome in outcomes), outcomes
    assert any("WorkLimit" in outcome for outcome in outcomes)
    # No call was stranded for good (at most two may be): a template renders afterwards.
    assert found["AFTER"] == ["True"]


def test_string_work_stops_at_the_deadline(model_path: Path) -> None:
    found = printed(model_path, "string_work_the_count_cannot_see")
    (outcome,) = found["OUTCOME"]
    assert outcome.startswith("WorkLimit: the chat template ran past its time (6 s"), outcome
    assert float(found["SECONDS"][0]) < 10


def test_memory_the_count_cannot_see_stops_at_the_heap_bound(model_path: Path) -> None:
    found = printed(model_path, "memory_the_count_cannot_see")
    (outcome,) = found["OUTCOME"]
    # Stopped by the heap's growth, the time, or (where the runtime's allocations are counted, as
    # in the wheel's builds) the byte count; before, it ran for minutes and took gigabytes.
    assert outcome.startswith("WorkLimit: "), outcome
    assert int(found["GREW_MB"][0]) < 1200
    assert float(found["SECONDS"][0]) < 10
