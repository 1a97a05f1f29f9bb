"""llama-server's command-line options, read from llama.cpp's ``common/arg.cpp`` inside the
llama-cpp-sys-4 crate package that llamactx links: each option's names (its negative forms,
``--no-...``, included) as llama.cpp registers them for the server example. ``docs/flags.md``
lists each of them as accepted by ``llamactx serve`` or not, and
``tests/project/test_flags_table.py`` checks the table against this list.

Run it to print one option per line: ``python scripts/llama_server_flags.py``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The examples (llama.cpp's ``LLAMA_EXAMPLE_*``) whose options llama-server takes: its own and
#: the common ones, which every example inherits.
SERVER_EXAMPLES = {"LLAMA_EXAMPLE_SERVER", "LLAMA_EXAMPLE_COMMON"}
#: The named lists of examples ``arg.cpp`` passes to ``set_examples``, resolved by reading it.
NAMED_LIST = re.compile(r"static std::initializer_list<enum llama_example> (\w+) = \{([^}]*)\};")


def crate_source() -> Path:
    """The llama.cpp source in the crate package the lock file pins (``cargo metadata``)."""
    metadata = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--offline"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "CARGO_TERM_COLOR": "never"},
    )
    packages = json.loads(metadata.stdout)["packages"]
    manifest = next(package["manifest_path"] for package in packages if package["name"] == "llama-cpp-sys-4")
    return Path(manifest).parent / "llama.cpp"


def calls(source: str, opening: str) -> list[str]:
    """The text of each call that starts with ``opening``, up to its closing parenthesis
    (parentheses inside strings, character literals and ``//`` comments left aside)."""
    found = []
    start = source.find(opening)
    while start >= 0:
        depth, at, quote = 0, start, ""
        while at < len(source):
            char = source[at]
            if quote:
                if char == "\\":
                    at += 1
                elif char == quote:
                    quote = ""
            elif source.startswith("//", at):
                at = source.find("\n", at) % (len(source) + 1)  # to the line's end (or the text's)
            elif char in "\"'":
                quote = char
            elif char == "(":
                depth += 1
            elif char == ")":
                depth -= 1
                if depth == 0:
                    break
            at += 1
        found.append(source[start : at + 1])
        start = source.find(opening, at)
    return found


def leading_lists(call: str) -> list[list[str]]:
    """The brace lists of strings that open ``common_arg(...)``: its names, then its negative
    names when it has them."""
    lists = []
    rest = call[call.index("common_arg(") + len("common_arg(") :]
    rest = re.sub(r"^\s*//.*$", "", rest, flags=re.MULTILINE)  # a comment before the names
    while True:
        match = re.match(r'\s*\{((?:\s*"[^"]*"\s*,?)*)\}\s*,', rest)
        if match is None:
            return lists
        lists.append(re.findall(r'"([^"]*)"', match.group(1)))
        rest = rest[match.end() :]


def examples(call: str, named: dict[str, set[str]], method: str) -> set[str] | None:
    """The examples ``call``'s ``set_examples`` (or ``set_excludes``) names; None without one."""
    match = re.search(rf"\.{method}\((\{{[^}}]*\}}|\w+)\)", call)
    if match is None:
        return None
    given = match.group(1)
    if given.startswith("{"):
        return set(re.findall(r"LLAMA_EXAMPLE_\w+", given))
    return named[given]


def server_flags(arg_cpp: str) -> list[list[str]]:
    """Each option llama-server takes: its names, negative forms after them."""
    named = {name: set(re.findall(r"LLAMA_EXAMPLE_\w+", body)) for name, body in NAMED_LIST.findall(arg_cpp)}
    options = []
    for call in calls(arg_cpp, "add_opt(common_arg("):
        shown = examples(call, named, "set_examples") or {"LLAMA_EXAMPLE_COMMON"}
        excluded = examples(call, named, "set_excludes") or set()
        if shown & SERVER_EXAMPLES and "LLAMA_EXAMPLE_SERVER" not in excluded:
            options.append([name for names in leading_lists(call) for name in names])
    return options


def main() -> int:
    for names in server_flags((crate_source() / "common" / "arg.cpp").read_text()):
        print(" ".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
