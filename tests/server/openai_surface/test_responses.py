"""llama.cpp's ``unit/test_compat_oai_responses.py``: OpenAI's Responses API through the official
client. Where it matches its model's words, the reply must be non-empty, and the streamed text
must be the completed response's; greedy (llama.cpp's samples), so that the reply is the same on
every run."""

from __future__ import annotations

import openai
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseIncompleteEvent,
    ResponseInputParam,
    ResponseTextDeltaEvent,
)

BOOK: ResponseInputParam = [
    {"role": "system", "content": "Book"},
    {"role": "user", "content": "What is the best book"},
]


def test_responses_with_openai_library(api: openai.OpenAI) -> None:
    response = api.responses.create(model="gpt-4.1", input=BOOK, max_output_tokens=8, temperature=0)
    assert response.output_text


def test_responses_stream_with_openai_library(api: openai.OpenAI) -> None:
    # The stream ends with response.completed, or (OpenAI's, when max_output_tokens cut the reply)
    # response.incomplete; llama.cpp's test compares the text only on the first.
    stream = api.responses.create(model="gpt-4.1", input=BOOK, max_output_tokens=8, temperature=0, stream=True)
    gathered = ""
    ended = []
    for event in stream:
        if isinstance(event, ResponseTextDeltaEvent):
            gathered += event.delta
        elif isinstance(event, (ResponseCompletedEvent, ResponseIncompleteEvent)):
            ended.append(event.response.output_text)
    assert ended == [gathered]
    assert gathered
