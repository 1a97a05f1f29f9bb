"""``docs/flags.md`` agrees with ``llamactx serve``'s parser and with llama-server's options (read
from llama.cpp's ``common/arg.cpp`` in the crate package llamactx links, by
``scripts/llama_server_flags.py``): every flag ``serve`` takes is in the table, the llama-server
names said to be accepted are taken, those said to be refused are not, and every llama-server
flag is one or the other; and llama-server's command lines mean the same here."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import load_script

from llamactx._llamactx import _gpu_devices
from llamactx._reasoning import thinking_kwargs
from llamactx.cli import _adapter, _parser

TABLE = Path(__file__).resolve().parents[2] / "docs" / "flags.md"
#: A flag in a table's cell: backquoted, starting with a dash.
FLAG = re.compile(r"`(-[^`\s]+)`")


def sections() -> dict[str, list[list[str]]]:
    """Each section's table rows, as their cells' text (header and rule rows left out)."""
    found: dict[str, list[list[str]]] = {}
    title = ""
    for line in TABLE.read_text().splitlines():
        if line.startswith("## "):
            title = line[3:]
            found[title] = []
        elif line.startswith("| ") and title and not line.startswith("| ---"):
            cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            found[title].append(cells)
    for rows in found.values():
        del rows[0]  # the header
    return found


def flags(rows: list[list[str]], column: int) -> list[str]:
    """The flags named in ``column`` of ``rows``."""
    return [flag for row in rows for flag in FLAG.findall(row[column])]


def serve_flags() -> set[str]:
    commands = next(action for action in _parser()._actions if isinstance(action, argparse._SubParsersAction))
    return {flag for action in commands.choices["serve"]._actions for flag in action.option_strings}


@pytest.fixture(scope="module")
def llama_server() -> list[list[str]]:
    reader = load_script("llama_server_flags")
    return reader.server_flags((reader.crate_source() / "common" / "arg.cpp").read_text())  # type: ignore[no-any-return]


def test_every_serve_flag_is_in_the_table_once() -> None:
    tables = sections()
    documented = flags(tables["Accepted under llama-server's names"], 1) + flags(tables["Only `llamactx serve`"], 0)
    assert sorted(set(documented)) == sorted(serve_flags())
    # Ours of an accepted row, or added: listed twice only where an added row repeats an alias.
    added = flags(tables["Only `llamactx serve`"], 0)
    assert len(added) == len(set(added))


def test_accepted_names_are_taken_and_refused_ones_are_not() -> None:
    tables = sections()
    accepted = flags(tables["Accepted under llama-server's names"], 0)
    refused = flags(tables["Not accepted, and why"], 0)
    for row in tables["Accepted under llama-server's names"]:
        assert set(FLAG.findall(row[0])) <= set(FLAG.findall(row[1])), row
    assert not set(refused) & serve_flags()
    assert not set(accepted) & set(refused)
    assert all(len(row[-1]) > 5 for row in tables["Not accepted, and why"])  # each refusal says why


def test_every_llama_server_flag_is_accepted_or_refused(llama_server: list[list[str]]) -> None:
    tables = sections()
    listed = set(flags(tables["Accepted under llama-server's names"], 0) + flags(tables["Not accepted, and why"], 0))
    theirs = {flag for names in llama_server for flag in names}
    assert len(llama_server) > 200  # the reader found llama-server's options
    assert sorted(theirs - listed) == []
    assert sorted(listed - theirs) == []


def test_a_llama_server_command_line_means_what_it_means_there(model_path: Path) -> None:
    """llama-server's names set the same settings as ours; its switches for what ``serve``
    always does are taken; ``--reasoning`` and ``--reasoning-effort`` go over the template
    variables of ``--chat-template-kwargs``."""
    line = ["serve", "-m", str(model_path), "-c", "8192", "-np", "4", "-fa", "on", "--jinja", "--metrics", "-cb"]
    line += ["--cache-prompt", "-md", str(model_path), "--spec-draft-n-max", "5", "--spec-draft-p-min", "0.5"]
    line += ["--embedding", "-mm", "projector.gguf", "-ngl", "99", "-mg", "1", "--no-cache-prompt"]
    line += ["--chat-template-kwargs", '{"enable_thinking": true, "greeting": "Hi."}', "-rea", "off"]
    line += ["--reasoning-effort", "low"]
    parsed = _parser().parse_args(line)
    assert (parsed.ctx, parsed.parallel, parsed.flash_attn, parsed.embeddings, parsed.mmproj) == (
        8192,
        4,
        1,
        True,
        "projector.gguf",
    )
    assert (parsed.draft_model, parsed.draft_max, parsed.draft_p_min) == (str(model_path), 5, 0.5)
    assert (parsed.n_gpu_layers, parsed.main_gpu, parsed.no_prefix_cache) == (99, 1, True)
    variables = thinking_kwargs(parsed.chat_template_kwargs, parsed.reasoning, parsed.reasoning_effort)
    assert variables == {"enable_thinking": False, "greeting": "Hi.", "reasoning_effort": "low"}
    ours = _parser().parse_args(["serve", "--ctx", "8192", "--spec-ngram-simple-size-n", "2", "--spec-ngram"])
    assert (ours.ctx, ours.spec_ngram_size_n, ours.spec_ngram_size_m) == (8192, 2, 16)
    defaults = _parser().parse_args(["serve"])
    assert thinking_kwargs(defaults.chat_template_kwargs, defaults.reasoning, defaults.reasoning_effort) == {}


def test_gpu_options_are_taken_and_a_build_without_a_gpu_says_they_change_nothing(model_path: Path) -> None:
    """Refused later (a reasoning budget below -1), before any model loads."""
    command = [
        sys.executable,
        "-m",
        "llamactx",
        "serve",
        "-m",
        str(model_path),
        "-ngl",
        "99",
        "--reasoning-budget",
        "-2",
    ]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 2
    assert ("this build has no GPU: -ngl and -mg change nothing" in finished.stderr) == (_gpu_devices() == 0)


def test_one_lora_adapter_is_taken_as_llama_server_writes_it() -> None:
    def adapter(*line: str) -> tuple[str, float] | None:
        return _adapter(_parser().parse_args(["serve", *line]))

    assert adapter() is None
    assert adapter("--lora", "a.gguf") == ("a.gguf", 1.0)
    assert adapter("--lora-scaled", "dir:x/a.gguf:0.5") == ("dir:x/a.gguf", 0.5)
    assert adapter("--lora", "a.gguf", "--lora-init-without-apply") == ("a.gguf", 0.0)
    with pytest.raises(ValueError, match="one LoRA adapter"):
        adapter("--lora", "a.gguf,b.gguf")
    with pytest.raises(ValueError, match="one LoRA adapter"):
        adapter("--lora", "a.gguf", "--lora-scaled", "b.gguf:2")
    with pytest.raises(ValueError, match="FILE:SCALE"):
        adapter("--lora-scaled", "a.gguf")
