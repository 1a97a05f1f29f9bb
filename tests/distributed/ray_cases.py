"""The Ray tests, run by ``test_ray.py`` in a network namespace whose only interface is
loopback: the README's Ray example; a Ray Data job over 16 prompts on 2 actors gives
``generate``'s greedy text row for row, at each row's own length (a prompt too long carries an
error instead); chat and embedding rows; Ray Serve replicas answer the ``openai`` client through
Serve's proxy, and a replica killed mid-load loses only the requests it had started and is
restarted. One local Ray, for the module, started with the README example's own ``ray.init``
arguments."""

from __future__ import annotations

import ast
import contextlib
import io
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from support.cpus import threads
from support.readme import EXAMPLES, RAY_EXAMPLE, README
from support.rpc_serving import free_port
from support.serving import MODEL_ID

import llamactx
from llamactx._embedding import embedding_context

ray = pytest.importorskip("ray", reason="the [ray] extra is not installed (make test installs it)")
import llamactx.ray  # noqa: E402

#: Whether importing the package imported Ray Serve too (it waits for ``app`` or ``build``).
SERVE_WITH_THE_PACKAGE = "ray.serve" in sys.modules
from ray import serve  # noqa: E402

N_SEQ = 2
N_CTX = 2048
MAX_TOKENS = 12
#: The Data job's rows (32 until 2026-12-06): two batches on each of two actors.
PROMPTS = 16
BATCH = 4  # each batch more requests than an engine's sequences
#: The lengths the Data job's first rows ask for, where the others ask for ``MAX_TOKENS`` (and
#: the Predictor's own is 50).
ROW_LENGTHS = (3, 6)
TOO_LONG = "word " * 2000  # more tokens than a sequence's N_CTX / N_SEQ cells
ALIAS = "gpt-4o-mini"


def readme_example() -> tuple[dict[str, Any], str]:
    """The README's Ray example: the keyword arguments of its ``ray.init``, and its code
    without its ``ray.init`` and ``ray.shutdown`` (the module's Ray, started with those
    arguments, stands for them: a Ray of its own cost 40 s of this worker's CPU)."""
    (code,) = [code for code in EXAMPLES if RAY_EXAMPLE in code]
    module = ast.parse(code)

    def calls(statement: ast.stmt, *names: str) -> bool:
        return isinstance(statement, ast.Expr) and ast.unparse(statement.value).startswith(
            tuple(f"ray.{name}(" for name in names)
        )

    (init,) = [statement for statement in module.body if calls(statement, "init")]
    assert isinstance(init, ast.Expr)
    assert isinstance(init.value, ast.Call)
    arguments = {keyword.arg: ast.literal_eval(keyword.value) for keyword in init.value.keywords if keyword.arg}
    statements = len(module.body)
    module.body = [statement for statement in module.body if not calls(statement, "init", "shutdown")]
    assert len(module.body) == statements - 2, "the example starts and stops Ray once"
    return arguments, ast.unparse(module)


README_INIT, README_CODE = readme_example()


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(**README_INIT, object_store_memory=256 * 2**20, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        # Stops the whole local cluster, Serve's controller, proxy and replicas with it (Serve's own
        # shutdown first waited for each replica to drain: 4.7 s of nothing to drain).
        ray.shutdown()


def test_the_readme_example_runs(cluster: None) -> None:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(README_CODE, str(README), "exec"), {})
    assert "Paris" in printed.getvalue(), printed.getvalue()


def prompts() -> list[str]:
    """Enough for two batches on each of two actors (``BATCH``)."""
    subjects = ["France", "Italy", "Japan", "Spain", "Egypt", "Peru", "Canada", "Kenya", "India", "Chile"]
    forms = ["The capital of {} is", "{} is a country in", "The flag of {} has", "People in {} speak"]
    return [f"{n}. " + forms[n % 4].format(subjects[n % 10]) for n in range(PROMPTS)]


def row_length(n: int) -> int:
    """The ``max_tokens`` the Data job's row ``n`` asks for."""
    return ROW_LENGTHS[n] if n < len(ROW_LENGTHS) else MAX_TOKENS


def test_a_ray_data_job_on_two_actors_equals_local_generate_under_each_rows_settings(
    cluster: None, model: llamactx.LlamaModel, model_path: Path
) -> None:
    """Every row sets its length and its sampling (greedy, over the Predictor's sampling and
    length); the Predictor's context options reach its engine. (Rows without settings take the
    Predictor's: ``test_missing_row_settings_take_the_defaults``.)"""
    rows = [
        {"prompt": prompt, "n": n, "max_tokens": row_length(n), "temperature": 0.0, "seed": n}
        for n, prompt in enumerate(prompts())
    ]
    rows.insert(PROMPTS // 3, {"prompt": TOO_LONG, "n": -1, "max_tokens": MAX_TOKENS, "temperature": 0.0, "seed": 0})
    job = ray.data.from_items(rows).map_batches(
        llamactx.ray.Predictor,
        fn_constructor_kwargs={
            "model_path": str(model_path),
            "max_tokens": 50,
            "sampling": llamactx.SamplingParams(),
            "n_seq_max": N_SEQ,
            "n_ctx": N_CTX,
            "prefix_cache": False,
            "context_options": {"n_batch": 256},
        },
        concurrency=2,
        num_cpus=1,
        batch_size=BATCH,
    )
    results = {row["n"]: row for row in job.take_all()}
    assert len(results) == PROMPTS + 1
    failed = results.pop(-1)
    assert failed["finish_reason"] == "error"
    assert "ValueError" in failed["error"]
    assert failed["generated_text"] == ""
    assert [results[n]["completion_tokens"] for n in range(len(ROW_LENGTHS))] == list(ROW_LENGTHS)
    with model.new_context(n_ctx=N_CTX, n_seq_max=N_SEQ) as ctx:
        for n, prompt in enumerate(prompts()):
            row = results[n]
            assert row["error"] is None
            assert row["generated_text"] == llamactx.generate(ctx, prompt, max_tokens=row_length(n)), prompt
            assert row["completion_tokens"] > 0
            assert row["prompt_tokens"] == len(model.str_to_token(prompt, model.add_bos_token()))


def test_missing_row_settings_take_the_defaults(model: llamactx.LlamaModel, model_path: Path) -> None:
    """Ray hands numpy batches: a setting column with a missing value is float, the value NaN."""
    predictor = llamactx.ray.Predictor(model_path=str(model_path), max_tokens=5, n_ctx=1024, threads=threads())
    prompt = "The capital of France is"
    batch = {
        "prompt": np.array([prompt, prompt], dtype=object),
        "max_tokens": np.array([3.0, np.nan]),
        "temperature": np.array([np.nan, 0.0]),
        "top_k": np.array([np.nan, 40.0]),  # an integer setting, as a float
    }
    try:
        done = predictor(batch)
    finally:
        predictor.engine.close()
    assert list(done["completion_tokens"]) == [3, 5]
    assert list(done["error"]) == [None, None]
    with model.new_context(n_ctx=N_CTX, n_seq_max=N_SEQ) as ctx:
        assert list(done["generated_text"]) == [llamactx.generate(ctx, prompt, max_tokens=limit) for limit in (3, 5)]


def test_chat_and_embedding_rows(cluster: None, model: llamactx.LlamaModel, model_path: Path) -> None:
    question = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    chat = ray.data.from_items([{"messages": question}, {"messages": [{"role": "user"}]}]).map_batches(
        llamactx.ray.Predictor,
        fn_constructor_kwargs={"model_path": str(model_path), "task": "chat", "max_tokens": 24, "n_ctx": 1024},
        concurrency=1,
        num_cpus=1,
    )
    # Ray Data does not keep the rows' order: the malformed message is the one without content.
    rows = chat.take_all()
    (answered,) = [row for row in rows if row["messages"][0].get("content")]
    (malformed,) = [row for row in rows if not row["messages"][0].get("content")]
    with model.new_context(n_ctx=1024, n_seq_max=N_SEQ) as ctx:
        assert answered["generated_text"] == llamactx.chat(ctx, question, max_tokens=24)
    assert "Paris" in answered["generated_text"]
    assert malformed["finish_reason"] == "error"

    texts = ["a cat sat on the mat", TOO_LONG, "the capital of France"]
    embedded = ray.data.from_items([{"text": text} for text in texts]).map_batches(
        llamactx.ray.Predictor,
        fn_constructor_kwargs={"model_path": str(model_path), "task": "embed"},
        concurrency=1,
        num_cpus=1,
    )
    rows = sorted(embedded.take_all(), key=lambda row: texts.index(row["text"]))
    expected = llamactx.embed(embedding_context(model, 8, 512, None), [texts[0], texts[2]])
    assert rows[1]["error"] is not None
    assert "ValueError" in rows[1]["error"]
    assert np.isnan(rows[1]["embedding"]).all()
    np.testing.assert_allclose(np.stack([rows[0]["embedding"], rows[2]["embedding"]]), expected, atol=1e-4)


@pytest.fixture(scope="module")
def served(cluster: None, model_path: Path) -> str:
    """Two replicas (2 parallel sequences each) behind Serve's proxy on a free loopback port,
    until the module's Ray stops."""
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(
        llamactx.ray.app(model_path, num_replicas=2, n_seq_max=2, n_ctx=2048, model_aliases=[ALIAS], strict_model=True),
        name="llamactx",
        route_prefix="/",
    )
    return f"http://127.0.0.1:{port}/v1"


def test_serve_answers_the_openai_client(served: str, model: llamactx.LlamaModel) -> None:
    with openai.OpenAI(base_url=served, api_key="unused", max_retries=0, timeout=120) as client:
        answer_as_the_local_model(client, model)
        # create_app's model options pass through: the alias is listed, other names refused.
        assert [card.id for card in client.models.list()] == [MODEL_ID, ALIAS]
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-3.5-turbo", messages=[{"role": "user", "content": "hi"}])


def answer_as_the_local_model(client: openai.OpenAI, model: llamactx.LlamaModel) -> None:
    question = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    whole = client.chat.completions.create(model=MODEL_ID, messages=question, max_tokens=24, temperature=0)
    text = whole.choices[0].message.content
    assert text is not None
    assert "Paris" in text
    with model.new_context(n_ctx=1024) as ctx:
        assert text == llamactx.chat(ctx, question, max_tokens=24)
    chunks = client.chat.completions.create(
        model=MODEL_ID, messages=question, max_tokens=24, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == text


def replica_pids() -> list[int]:
    """The processes of Serve's llamactx replicas (Ray names them in their command line) that
    this process's Ray session started (its descendants: another Ray on the machine, such as a
    parallel test worker's, has its own)."""
    parents, replicas = {}, []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                command = Path(f"/proc/{entry}/cmdline").read_bytes()
                # The parent is the field after the command name, which ends at the last ')'.
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if b"ServeReplica:llamactx" in command:
                replicas.append(int(entry))

    def descends_from_this_process(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    return [pid for pid in replicas if descends_from_this_process(pid)]


def test_a_replica_killed_mid_load_loses_only_its_started_requests(served: str) -> None:
    with openai.OpenAI(base_url=served, api_key="unused", max_retries=0, timeout=120) as client:
        lose_at_most_the_started_requests(client)


def lose_at_most_the_started_requests(client: openai.OpenAI) -> None:
    victims = replica_pids()
    assert len(victims) == 2

    def ask(n: int) -> str:
        try:
            client.completions.create(model=MODEL_ID, prompt=f"{n}. Once upon a time", max_tokens=32, temperature=0)
        except openai.APIError as error:
            return f"failed: {error}"
        return "ok"

    # 16 requests of 32 tokens from 12 callers: the replicas run 4 at once, a few seconds in all,
    # so the kill lands while the victim runs requests and others wait in Serve's queue.
    killer = threading.Timer(1.5, os.kill, (victims[0], signal.SIGKILL))
    killer.start()
    with ThreadPoolExecutor(12) as callers:
        outcomes = list(callers.map(ask, range(16)))
    killer.join()
    failed = [outcome for outcome in outcomes if outcome != "ok"]
    # A replica runs at most n_seq_max (2) requests; the rest waited in Serve's queue.
    assert len(failed) <= 2, failed
    deadline = time.monotonic() + 180
    while True:
        status: Any = serve.status().applications["llamactx"]
        replicas = status.deployments["llamactx"].replica_states
        if replicas.get("RUNNING") == 2 and set(replica_pids()) - set(victims) and len(replica_pids()) == 2:
            break
        assert time.monotonic() < deadline, f"Serve did not restart the replica: {replicas}"
        time.sleep(1)
    assert ask(99) == "ok"


def test_the_package_imports_serve_for_app_and_build_only() -> None:
    """A Ray Data actor unpickles ``Predictor`` from ``llamactx.ray``, without Serve's import."""
    assert not SERVE_WITH_THE_PACKAGE
    assert llamactx.ray.app.__module__ == llamactx.ray.build.__module__ == "llamactx.ray._serve"
    with pytest.raises(AttributeError, match="no attribute 'apps'"):
        llamactx.ray.apps  # noqa: B018


def test_serve_run_arguments_build_the_app(model_path: Path) -> None:
    built = llamactx.ray.build({"model_path": str(model_path), "num_replicas": "2", "n_seq_max": "4", "num_cpus": "1"})
    assert isinstance(built, serve.Application)
    with pytest.raises(ValueError, match="model_path"):
        llamactx.ray.build({"num_replicas": "2"})
    with pytest.raises(TypeError):
        llamactx.ray.build({"model_path": str(model_path), "replicas": "2"})
