"""The request bodies the server accepts: OpenAI's parameters where llama.cpp can honour them,
and llama-server's extras (``top_k``, ``min_p``, ``repeat_penalty``, ``grammar``). Anything
else, a wrong type or an out-of-range number is refused with 400 before it reaches the engine."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from llamactx._limits import INT32_MAX

__all__ = ["PENALTY_WINDOW_MAX", "ChatRequest", "CompletionRequest", "EmbeddingRequest", "Message", "SamplingBody"]

#: The longest penalty window the engine takes.
PENALTY_WINDOW_MAX = 2**20
# OpenAI takes a 64-bit seed; llama.cpp's generator takes 32 bits (the server uses seed mod 2**32).
SEED_RANGE = {"ge": -(2**63), "lt": 2**64}

Count = Annotated[int, Field(ge=1, le=128)]
TokenCount = Annotated[int, Field(ge=0, le=INT32_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
StopStrings = str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=16)]


class _Body(BaseModel):
    """Strict JSON: no unknown fields, no strings for numbers, no infinities."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool = False


class JsonSchemaFormat(_Body):
    """``response_format.json_schema``: the schema is always enforced, ``strict`` or not."""

    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def output_schema(self) -> dict[str, Any] | None:
        """The JSON Schema the output must match (None: any text)."""
        if self.type == "json_schema":
            if self.json_schema is None:
                return None
            return self.json_schema.schema_
        if self.type == "json_object":
            return {"type": "object"}
        return None


class SamplingBody(_Body):
    """What completions and chat share: sampling, stopping and llama-server's extras. The
    defaults of ``temperature``, ``top_p``, ``top_k`` and ``min_p`` are llama.cpp's."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Count = 1
    stop: StopStrings | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 0.8
    top_p: Probability = 0.95
    seed: Annotated[int, Field(**SEED_RANGE)] | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    user: str | None = None
    top_k: Annotated[int, Field(ge=0, le=INT32_MAX)] = 40
    min_p: Probability = 0.05
    typical_p: Probability = 1.0
    repeat_penalty: Annotated[float, Field(ge=0.0, le=10.0)] = 1.0
    repeat_last_n: Annotated[int, Field(ge=-1, le=PENALTY_WINDOW_MAX)] = 64
    grammar: str | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(SamplingBody):
    """``POST /v1/completions``: one choice per prompt and ``n``."""

    prompt: str | list[str] | Annotated[list[TokenId], Field(min_length=1)] | list[list[TokenId]]
    max_tokens: TokenCount | None = 16
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: Literal[False] = False
    best_of: Count | None = None
    suffix: None = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


class FunctionCall(_Body):
    name: str
    arguments: str


class ToolCall(_Body):
    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The content as one string (text parts joined)."""
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class Function(_Body):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern="^[A-Za-z0-9_-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: Function


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: FunctionName


class ChatRequest(SamplingBody):
    """``POST /v1/chat/completions``: the reply to ``messages``, formatted with the model's
    chat template."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    # Accepted and ignored, as by OpenAI without storage or tiers.
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True


class EmbeddingRequest(_Body):
    """``POST /v1/embeddings``."""

    model: str
    input: str | Annotated[list[str], Field(min_length=1, max_length=2048)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None
