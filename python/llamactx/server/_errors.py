"""Every failure as the client sees it: ``ApiError`` (OpenAI's error object, its status and
``Retry-After``), and the table (``ERRORS``) that turns what the engine raises into one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from llamactx._llamactx import ChatTemplateError, EngineBusy, LlamaCppError, SamplerInitError, StringToTokenError

__all__ = [
    "CLIENT_GONE",
    "ERRORS",
    "ApiError",
    "ContextLengthExceeded",
    "ErrorBody",
    "Outcome",
    "openai_error",
    "shutting_down",
]

#: Seconds a client is told to wait when the engine's queue is full or it is shutting down.
RETRY_AFTER_SECONDS = 1
#: Not an HTTP status a client sees: the client left before the response (nginx's number).
CLIENT_GONE = 499

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_supported_error",
    503: "overloaded_error",
}


class ErrorDetail(TypedDict):
    message: str
    type: str
    param: str | None
    code: str | None


class ContextLengthDetail(ErrorDetail):
    """The error object of ``context_length_exceeded``, with llama-server's numbers."""

    n_prompt_tokens: int
    n_ctx: int


class ErrorBody(TypedDict):
    """OpenAI's error object."""

    error: ErrorDetail


class ApiError(Exception):
    """A failure the client should see as ``{"error": {...}}`` with ``status`` (the error's
    ``type`` follows from it), naming the parameter at fault and OpenAI's ``code`` when there is
    one; ``retry_after`` seconds, when set, go out as ``Retry-After``."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None, retry_after: int = 0
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> ErrorBody:
        kind = _ERROR_TYPES.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after else {}


class ContextLengthExceeded(ApiError):
    """A prompt of ``n_prompt_tokens`` that cannot fit the ``n_ctx`` tokens a request holds
    (prompt and completion): OpenAI's code, and llama-server's numbers in the error object for
    clients that trim the prompt to fit."""

    def __init__(self, n_prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(
            400,
            f"the prompt has {n_prompt_tokens} tokens; a request of this server holds at most {n_ctx} "
            "(prompt and completion)",
            code="context_length_exceeded",
        )
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx

    def body(self) -> ErrorBody:
        detail: ContextLengthDetail = {
            **super().body()["error"],
            "n_prompt_tokens": self.n_prompt_tokens,
            "n_ctx": self.n_ctx,
        }
        return {"error": detail}


@dataclass(frozen=True)
class Outcome:
    """What a client sees of an exception: the status (OpenAI's error ``type`` follows from it),
    OpenAI's ``code``, and the seconds of ``Retry-After``."""

    status: int
    code: str | None = None
    retry_after: int = 0


#: Exceptions raised by the engine, as the client sees them: the first row whose type matches.
#: A 400 is the request's own fault (a value the engine refuses, a constraint that cannot be
#: compiled or that failed while generating: ``SchemaError`` is a ``ValueError``); it names the
#: parameter the exception carries (``param``) or else the one the failing step was given. An
#: exception of no row is a bug: the app logs it and answers 500.
ERRORS: tuple[tuple[type[Exception], Outcome], ...] = (
    (EngineBusy, Outcome(503, "server_busy", RETRY_AFTER_SECONDS)),
    (SamplerInitError, Outcome(400)),
    (ChatTemplateError, Outcome(400)),  # rendering passed the work limit
    (StringToTokenError, Outcome(400)),
    (ValueError, Outcome(400)),
    (LlamaCppError, Outcome(500)),
)


def openai_error(error: Exception, doing: str, param: str | None = None) -> Exception:
    """``error`` as the client sees it (``ERRORS``) while ``doing`` (what failed, for the
    message) on ``param``; ``error`` itself when no row matches."""
    if isinstance(error, ApiError):
        return error
    for kind, outcome in ERRORS:
        if isinstance(error, kind):
            named = (getattr(error, "param", None) or param) if outcome.status == 400 else None
            detail = f"{type(error).__name__}: {error}" if outcome.status == 500 else str(error)
            return ApiError(
                outcome.status, f"{doing}: {detail}", param=named, code=outcome.code, retry_after=outcome.retry_after
            )
    return error


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", retry_after=RETRY_AFTER_SECONDS)
