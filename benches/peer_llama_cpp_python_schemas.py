"""The JSON Schema corpus through llama-cpp-python's converter (``LlamaGrammar.from_json_schema``)
and its greedy chat completion, run with ITS interpreter by benches/structured.py:

    .venv-peers/bin/python benches/peer_llama_cpp_python_schemas.py MODEL CORPUS MAX_TOKENS START

Prints one JSON line per schema from index START on: "refused" (the converter or llama.cpp's
grammar parser raised), "length", "valid" or "invalid". A crash ends the output early; the
caller goes on after the schema that caused it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import llama_cpp


def main() -> None:
    model, corpus_path, max_tokens, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    corpus = json.loads(Path(corpus_path).read_text(encoding="utf-8"))
    llm = llama_cpp.Llama(model_path=model, n_ctx=2048, verbose=False)
    for index in range(start, len(corpus)):
        entry = corpus[index]
        print(json.dumps({"index": index, "outcome": "started"}), flush=True)
        try:
            grammar = llama_cpp.LlamaGrammar.from_json_schema(json.dumps(entry["schema"]), verbose=False)
        except Exception:  # any refusal of the converter counts as one
            print(json.dumps({"index": index, "outcome": "refused"}), flush=True)
            continue
        reply = llm.create_chat_completion(
            messages=[{"role": "user", "content": entry["prompt"]}],
            grammar=grammar,
            max_tokens=max_tokens,
            temperature=0,
        )
        choice = reply["choices"][0]
        outcome = "length"
        if choice["finish_reason"] == "stop":
            try:
                checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
                jsonschema.validate(json.loads(choice["message"]["content"]), entry["schema"], format_checker=checker)
                outcome = "valid"
            except (ValueError, jsonschema.ValidationError):
                outcome = "invalid"
        print(json.dumps({"index": index, "outcome": outcome}), flush=True)


if __name__ == "__main__":
    main()
