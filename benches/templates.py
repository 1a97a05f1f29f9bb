"""llama.cpp's own chat templates (``models/templates/*.jinja``, from the llama.cpp that
llama-cpp-python 0.3.36 vendors) applied by llamactx and by llama-server (``xllamacpp``), with
the default model's weights, in one run:

1. the rendered prompts of six conversations a template meets (a user turn alone, a system
   turn, several turns, tools offered, a tool call and its result, an earlier reply's
   reasoning): llamactx's tokens read back as text, against llama-server's
   ``POST /apply-template``;
2. the replies: with ``tool_choice: "required"``, how many replies each parses into a tool call
   with JSON arguments; and on a question, how many replies each splits into
   ``reasoning_content`` and ``content`` (greedy, both servers, the same ``max_tokens``).

A difference in (1) that has a reason is counted under it (``REASONS``); any other is listed
with where the two texts part.

    python benches/templates.py --peer-python .venv-peers/bin/python [--templates DIR] [--out bench-results]

Without ``--templates`` the templates come from llama-cpp-python's source distribution on
PyPI, kept in ``~/.cache/llamactx/llama-templates``. Writes templates.json into --out.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from server import BENCHES, free_port, started

import llamactx
from llamactx._render import ChatRenderer

SDIST = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
CACHE = Path.home() / ".cache" / "llamactx" / "llama-templates"
MAX_TOKENS = 96
SERVERS = ("llamactx", "llama-server")
CTX = 4096

#: Offered in a non-canonical key order (description last, required before properties): a
#: template shows the caller's tool as given.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "required": ["city"],
                "properties": {
                    "city": {"type": "string", "description": "the city's name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
            },
            "description": "The current weather in a city.",
        },
    }
]
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call12345",  # Mistral's templates take 9 letters or digits
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ],
}
CONVERSATIONS: dict[str, dict[str, Any]] = {
    "user": {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
    "system": {
        "messages": [
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": "What is the capital of France?"},
        ]
    },
    "multi-turn": {
        "messages": [
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Italy?"},
        ]
    },
    "tools": {"messages": [QUESTION], "tools": TOOLS},
    "tool result": {
        "messages": [QUESTION, CALL, {"role": "tool", "tool_call_id": "call12345", "content": "18 C, sunny"}],
        "tools": TOOLS,
    },
    "reasoning": {
        "messages": [
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "reasoning_content": "The user asks for a capital.", "content": "Paris."},
            {"role": "user", "content": "And of Italy?"},
        ]
    },
}
REASONING_QUESTION = [{"role": "user", "content": "What is 17 times 23? Think step by step."}]

#: Differences by design, each with the test that holds it.
REASONS = {
    "json tool protocol": "a template without a tool-call format (llama.cpp's analysis finds none) gets "
    "llamactx's JSON reply protocol in its system turn, so that a call is always parseable; llama-server "
    "hands such a template the tools, which it does not show (tests/generation/test_tools.py)",
}


def templates_dir(given: Path | None) -> Path:
    """``given``, or llama.cpp's templates from llama-cpp-python's sdist, fetched once."""
    if given is not None:
        return given
    if not any(CACHE.glob("*.jinja")):
        index = f"https://pypi.org/simple/{SDIST}/"
        request = urllib.request.Request(index, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            files = json.load(response)["files"]
        name = f"{SDIST.replace('-', '_')}-{SDIST_VERSION}.tar.gz"
        url = next(entry["url"] for entry in files if entry["filename"] == name)
        with urllib.request.urlopen(url, timeout=600) as response:
            packed = io.BytesIO(response.read())
        CACHE.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=packed) as archive:
            for member in archive.getmembers():
                if member.isfile() and "/models/templates/" in member.name and member.name.endswith(".jinja"):
                    source = archive.extractfile(member)
                    if source is not None:
                        (CACHE / Path(member.name).name).write_bytes(source.read())
    return CACHE


def ours(renderer: ChatRenderer, conversation: dict[str, Any]) -> str:
    """The prompt llamactx renders, as text (without the BOS the tokenizer adds, which
    llama-server's text leaves out too)."""
    prepared = renderer.prepare(conversation["messages"], conversation.get("tools", ()))
    tokens = prepared.tokens[1:] if renderer.model.add_bos_token() else prepared.tokens
    return renderer.model.detokenize(tokens, unparse_special=True)


def theirs(url: str, conversation: dict[str, Any]) -> str | None:
    response = httpx.post(f"{url}/apply-template", json=conversation, timeout=60)
    if response.status_code != 200:
        return None
    prompt: str = response.json()["prompt"]
    return prompt


def parted(a: str, b: str) -> dict[str, Any]:
    """Where two texts part, with a little of each from there."""
    at = next((index for index, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return {"at": at, "llamactx": a[max(0, at - 40) : at + 80], "llama-server": b[max(0, at - 40) : at + 80]}


def replies(url: str) -> dict[str, Any]:
    """Whether a required call parses into a tool call with JSON arguments, and whether a
    question's reply splits off its reasoning."""
    greedy = {"temperature": 0, "max_tokens": MAX_TOKENS}
    called = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [QUESTION], "tools": TOOLS, "tool_choice": "required", **greedy},
        timeout=600,
    )
    calls = called.json()["choices"][0]["message"].get("tool_calls") if called.status_code == 200 else None
    parsed = False
    for call in calls or ():
        try:
            json.loads(call["function"]["arguments"])
            parsed = True
        except (ValueError, KeyError, TypeError):
            pass
    thought = httpx.post(f"{url}/v1/chat/completions", json={"messages": REASONING_QUESTION, **greedy}, timeout=600)
    reasoning = thought.json()["choices"][0]["message"].get("reasoning_content") if thought.status_code == 200 else None
    shown = [
        answer.json()["choices"][0]["message"] if answer.status_code == 200 else answer.text
        for answer in (called, thought)
    ]
    return {"parsed_call": parsed, "reasoning_split": bool(reasoning), "messages": shown}


def compare(template: Path, model: Any, peer_python: Path, logs: Path) -> dict[str, Any]:
    """Both renderings of every conversation, and both servers' replies, for ``template``."""
    result: dict[str, Any] = {"renderings": {}}
    try:
        renderer = ChatRenderer(model, template.read_text())
        parsed = renderer._parsed()  # a template given to the renderer raises if it does not parse
        tool_format = parsed is not None and parsed.supports_tool_calls
    except llamactx.ChatTemplateError as error:
        renderer, tool_format = None, False
        result["llamactx_refused"] = str(error)
    sizes = ["--threads", "2", "--parallel", "1", "--ctx", str(CTX), "--chat-template-file", str(template)]
    with ExitStack() as servers:
        urls: dict[str, str | None] = {}
        for name, program in (
            ("llamactx", [sys.executable, "-m", "llamactx", "serve"]),
            ("llama-server", [str(peer_python), str(BENCHES / "peer_xllamacpp_server.py")]),
        ):
            port = free_port()
            command = [*program, "--model", llamactx.default_model_path(), "--port", str(port), *sizes]
            try:
                log = logs / f"templates-{template.stem}-{name}.log"
                urls[name] = servers.enter_context(started(command, f"http://127.0.0.1:{port}", log))
            except SystemExit:  # `started`'s way of saying the server refused to start
                urls[name] = None
                result[f"{name}_refused"] = "the server did not start"
        for label, conversation in CONVERSATIONS.items():
            peer = None if urls["llama-server"] is None else theirs(urls["llama-server"], conversation)
            try:
                mine = None if renderer is None else ours(renderer, conversation)
            except ValueError as error:
                mine = None
                result["renderings"][label] = {"equal": False, "refused_by": "llamactx", "error": str(error)}
                continue
            if mine is None or peer is None:
                refused_by = "llamactx" if mine is None else "llama-server"
                result["renderings"][label] = {"equal": False, "refused_by": refused_by}
            elif mine == peer:
                result["renderings"][label] = {"equal": True}
            elif "tools" in conversation and not tool_format:
                result["renderings"][label] = {"equal": False, "reason": "json tool protocol"}
            else:
                result["renderings"][label] = {"equal": False, **parted(mine, peer)}
        result["replies"] = {name: None if url is None else replies(url) for name, url in urls.items()}
    return result


def summary(results: dict[str, Any]) -> dict[str, Any]:
    renderings = [rendering for result in results.values() for rendering in result["renderings"].values()]
    equal_templates = sum(all(r.get("equal") for r in result["renderings"].values()) for result in results.values())
    counts: dict[str, Any] = {
        "templates": len(results),
        "templates_rendered_equal": equal_templates,
        "conversations": len(renderings),
        "conversations_equal": sum(bool(r.get("equal")) for r in renderings),
        "conversations_different_by_reason": {
            reason: sum(r.get("reason") == reason for r in renderings) for reason in REASONS
        },
        "conversations_different_unexplained": sum(
            not r.get("equal") and "reason" not in r and "refused_by" not in r for r in renderings
        ),
        "conversations_refused": {name: sum(r.get("refused_by") == name for r in renderings) for name in SERVERS},
        "templates_refused": {name: sum(f"{name}_refused" in r for r in results.values()) for name in SERVERS},
    }
    for kind in ("parsed_call", "reasoning_split"):
        counts[kind] = {
            name: sum(bool((result["replies"].get(name) or {}).get(kind)) for result in results.values())
            for name in SERVERS
        }
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", type=Path, required=True)
    parser.add_argument("--templates", type=Path, help="a folder of .jinja templates (default: llama.cpp's)")
    parser.add_argument("--only", help="the templates whose file names contain this")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    arguments = parser.parse_args()
    model = llamactx.LlamaModel.load_from_file(llamactx.default_model_path())
    results: dict[str, Any] = {}
    for template in sorted(templates_dir(arguments.templates).glob("*.jinja")):
        if arguments.only and arguments.only not in template.name:
            continue
        results[template.stem] = compare(template, model, arguments.peer_python, arguments.out / "logs")
        equal = sum(bool(r.get("equal")) for r in results[template.stem]["renderings"].values())
        print(f"{template.stem:55} equal {equal}/{len(CONVERSATIONS)}; replies {results[template.stem]['replies']}")
    counts = summary(results)
    print(json.dumps(counts, indent=2))
    arguments.out.mkdir(parents=True, exist_ok=True)
    (arguments.out / "templates.json").write_text(json.dumps({"summary": counts, "templates": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
