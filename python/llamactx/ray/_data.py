"""Batch inference with Ray Data: ``Predictor``, a callable class for ``map_batches``."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import ray

from llamactx._embedding import embed, embedding_context
from llamactx._engine import Engine, Request
from llamactx._llamactx import LlamaModel, SamplingParams
from llamactx._sampling import SAMPLING_DEFAULTS

__all__ = ["Predictor", "actor_threads"]

Task = Literal["generate", "chat", "embed"]
Batch = dict[str, npt.NDArray[Any]]

# Columns that, when the dataset has them, set a row's sampling: SamplingParams' fields but its
# logit_bias (a mapping, not a value of a column).
SAMPLING_COLUMNS = tuple(name for name in SAMPLING_DEFAULTS if name != "logit_bias")
#: Those that hold integers (Ray hands a column with a missing value as floats).
INTEGER_COLUMNS = frozenset(
    {"max_tokens", "seed", *(name for name, default in SAMPLING_DEFAULTS.items() if isinstance(default, int))}
)
# Enough for any batch Ray Data hands one actor: every row waits in the engine at once.
MAX_WAITING = 1 << 20


def actor_threads() -> int:
    """The CPUs Ray assigned to the calling worker (its ``num_cpus``, at least 1), or every CPU
    this process may use outside a Ray worker: the threads an actor should compute with, since
    ggml's threads spin and more threads than CPUs run many times slower."""
    if ray.is_initialized():
        resources = ray.get_runtime_context().get_assigned_resources()  # type: ignore[no-untyped-call]
        assigned = resources.get("CPU")
        if assigned:
            return max(1, int(assigned))
    return len(os.sched_getaffinity(0))


class Predictor:
    """Runs a model over Ray Data batches, one model per actor::

        dataset.map_batches(
            Predictor,
            fn_constructor_kwargs={"model_path": path, "task": "generate", "max_tokens": 64},
            concurrency=2,  # actors
            num_cpus=2,  # CPUs per actor: the threads each computes with (see actor_threads)
            batch_size=64,
        )

    ``task`` "generate" reads ``prompt_column`` (text), "chat" reads ``messages_column``
    (``{"role", "content"}`` lists), both through an ``Engine`` of ``n_seq_max`` parallel
    sequences and ``n_ctx`` cells (``prefix_cache`` as the engine's: without it each row's
    output equals ``generate`` on a context of the same options; ``context_options``, further
    ``new_context`` keywords such as ``flash_attn_type``); each row may set ``max_tokens`` and sampling
    (any field of ``SamplingParams`` but ``logit_bias``: ``temperature``, ``top_k``, ``seed``, ...)
    in columns of those names, else ``sampling`` applies (greedy when None); a missing value (None, or NaN in a column
    Ray made float) is the default. They add ``generated_text``,
    ``prompt_tokens``, ``completion_tokens``, ``finish_reason`` and ``error``. "embed" reads
    ``text_column`` and adds ``embedding`` (float32, normalised; NaN for a failed row) and
    ``error``. A row that fails (a prompt too long for a sequence, a malformed message) has its
    message in ``error`` (None elsewhere) and ``finish_reason`` "error"; the other rows and
    the job go on. Input columns are passed through.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        task: Task = "generate",
        max_tokens: int = 128,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        n_seq_max: int = 8,
        n_ctx: int = 4096,
        prefix_cache: bool = True,
        threads: int | None = None,
        context_options: Mapping[str, Any] | None = None,
        rpc_servers: Sequence[str] | None = None,
        prompt_column: str = "prompt",
        messages_column: str = "messages",
        text_column: str = "text",
    ) -> None:
        if task not in ("generate", "chat", "embed"):
            raise ValueError(f"task must be 'generate', 'chat' or 'embed', got {task!r}")
        self.task = task
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.stop = list(stop)
        self.columns = {"generate": prompt_column, "chat": messages_column, "embed": text_column}
        used = threads or actor_threads()
        self.model = LlamaModel.load_from_file(Path(model_path), rpc_servers=rpc_servers)
        if task == "embed":
            self.embedding = embedding_context(self.model, n_seq_max, 512, used)
        else:
            self.engine = Engine(
                self.model,
                max_waiting=MAX_WAITING,
                prefix_cache=prefix_cache,
                n_ctx=n_ctx,
                n_seq_max=n_seq_max,
                n_threads=used,
                n_threads_batch=used,
                **(context_options or {}),
            )

    def __call__(self, batch: Batch) -> Batch:
        column = self.columns[self.task]
        if column not in batch:
            raise KeyError(f"the batch has no {column!r} column (it has {sorted(batch)})")
        added = self._embed(batch[column]) if self.task == "embed" else self._generate(batch, batch[column])
        return {**batch, **added}

    def _generate(self, batch: Batch, inputs: npt.NDArray[Any]) -> Batch:
        requests: list[Request | str] = []
        for row, value in enumerate(inputs):
            try:
                requests.append(self._submit(value, self._max_tokens(batch, row), self._sampling(batch, row)))
            except Exception as error:  # the row's error is the job's output
                requests.append(_message(error))
        columns: dict[str, list[Any]] = {
            "generated_text": [],
            "prompt_tokens": [],
            "completion_tokens": [],
            "finish_reason": [],
            "error": [],
        }
        for request in requests:
            outcome: tuple[str, int, int, str, str | None]
            try:
                if isinstance(request, str):
                    outcome = ("", 0, 0, "error", request)
                else:
                    done = request.result()
                    outcome = (done.text, done.prompt_tokens, done.completion_tokens, done.finish_reason, None)
            except Exception as error:  # the row's error is the job's output
                outcome = ("", 0, 0, "error", _message(error))
            for values, value in zip(columns.values(), outcome, strict=True):
                values.append(value)
        return {
            name: np.array(values, dtype=np.int64) if name.endswith("_tokens") else _objects(values)
            for name, values in columns.items()
        }

    def _submit(self, value: Any, max_tokens: int, sampling: SamplingParams | None) -> Request:
        if self.task == "chat":
            messages = [dict(message) for message in value]
            return self.engine.submit_chat(messages, max_tokens=max_tokens, stop=self.stop, sampling=sampling)
        if not isinstance(value, str):
            raise TypeError(f"a prompt must be text, got {type(value).__name__}")
        return self.engine.submit(value, max_tokens=max_tokens, stop=self.stop, sampling=sampling)

    def _max_tokens(self, batch: Batch, row: int) -> int:
        value = _setting(batch, "max_tokens", row)
        return self.max_tokens if value is None else value

    def _sampling(self, batch: Batch, row: int) -> SamplingParams | None:
        values = {name: _setting(batch, name, row) for name in SAMPLING_COLUMNS}
        chosen = {name: value for name, value in values.items() if value is not None}
        return SamplingParams(**chosen) if chosen else self.sampling

    def _embed(self, texts: npt.NDArray[Any]) -> Batch:
        vectors = np.full((len(texts), self.model.n_embd()), np.nan, dtype=np.float32)
        errors: list[str | None] = [None] * len(texts)
        try:
            vectors[:] = embed(self.embedding, [str(text) for text in texts])
        except ValueError:
            # One text spoils `embed` for all: embed them one by one, keeping each one's error.
            for row, text in enumerate(texts):
                try:
                    vectors[row] = embed(self.embedding, [str(text)])[0]
                except ValueError as error:
                    errors[row] = _message(error)
        return {"embedding": vectors, "error": _objects(errors)}

    def __del__(self) -> None:
        engine: Engine | None = getattr(self, "engine", None)
        if engine is not None:
            engine.close()


def _setting(batch: Batch, name: str, row: int) -> Any:
    """Row ``row``'s value of the setting column ``name``; None (the default) where the batch has
    no such column or the row's value is missing (None, or NaN in a column numpy made float)."""
    value = _python(batch[name][row]) if name in batch else None
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value) if name in INTEGER_COLUMNS else value


def _python(value: Any) -> Any:
    """A numpy scalar as the Python value it holds (object columns hold Python values already;
    a missing value is None)."""
    return value.item() if isinstance(value, np.generic) else value


def _message(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _objects(values: Sequence[Any]) -> npt.NDArray[np.object_]:
    """A 1-D object array (numpy would make a 2-D one of equal-length lists, or a fixed-width
    string array)."""
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array
