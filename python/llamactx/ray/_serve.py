"""Online serving with Ray Serve: ``app``, replicas of the OpenAI-compatible server."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application
from starlette.types import ASGIApp

from llamactx._engine import Engine
from llamactx._llamactx import LlamaModel
from llamactx.ray._data import actor_threads

__all__ = ["app", "build"]


@serve.ingress()
class LlamaReplica:
    """One replica: the model, an engine on it, and the OpenAI-compatible app on the engine."""

    def __init__(self, model_path: str, engine_options: dict[str, Any], app_options: dict[str, Any]) -> None:
        engine_options = dict(engine_options)
        threads = engine_options.pop("threads", None) or actor_threads()
        rpc_servers = engine_options.pop("rpc_servers", None)
        self.model = LlamaModel.load_from_file(Path(model_path), rpc_servers=rpc_servers)
        self.engine = Engine(self.model, n_threads=threads, n_threads_batch=threads, **engine_options)
        self.app_options = app_options

    def __serve_build_asgi_app__(self) -> ASGIApp:
        from llamactx.server import create_app

        return create_app(self.engine, **self.app_options)

    def check_health(self) -> None:
        """Serve's health check: a replica whose engine stopped is replaced."""
        if self.engine.closed:
            raise RuntimeError("the replica's engine is closed")
        self.engine.stats()

    def __del__(self) -> None:
        engine: Engine | None = getattr(self, "engine", None)
        if engine is not None:
            engine.close()


def app(
    model_path: str | os.PathLike[str],
    *,
    num_replicas: int = 1,
    autoscaling_config: Mapping[str, Any] | None = None,
    n_ctx: int = 4096,
    n_seq_max: int = 8,
    max_waiting: int = 1024,
    prefix_cache: bool = True,
    threads: int | None = None,
    context_options: Mapping[str, Any] | None = None,
    num_cpus: float = 1,
    rpc_servers: Sequence[str] | None = None,
    model_id: str | None = None,
    model_aliases: Sequence[str] = (),
    strict_model: bool = False,
    api_key: str | None = None,
    name: str = "llamactx",
) -> Application:
    """A Ray Serve application: ``num_replicas`` replicas, each with the model (from
    ``model_path``, which must exist on every node that runs one), an ``Engine`` of
    ``n_seq_max`` parallel sequences and OpenAI's API on it (``/v1/chat/completions``,
    ``/v1/completions``, ``/v1/models``, ``/health``, ``/metrics``), behind Serve's HTTP proxy::

        serve.run(llamactx.ray.app(path, num_replicas=2), route_prefix="/")

    Serve sends a replica at most ``n_seq_max`` requests at a time, the engine's parallel
    sequences: the rest wait in Serve's queue, from which a failed replica's share goes to the
    others. ``autoscaling_config`` (Serve's; it replaces ``num_replicas``) targets
    ``n_seq_max`` ongoing requests per replica unless it says otherwise. Serve's health check
    fails for a replica whose engine stopped, which Serve then replaces. Each replica reserves
    ``num_cpus`` CPUs and computes with that many threads unless ``threads`` says otherwise;
    ``context_options`` are further ``new_context`` keywords for the engine's context;
    ``model_id``, ``model_aliases``, ``strict_model`` and ``api_key`` are ``create_app``'s.
    """
    engine_options = {
        "n_ctx": n_ctx,
        "n_seq_max": n_seq_max,
        "max_waiting": max_waiting,
        "prefix_cache": prefix_cache,
        "threads": threads,
        **(context_options or {}),
        "rpc_servers": list(rpc_servers) if rpc_servers else None,
    }
    app_options = {
        "model_id": model_id or Path(model_path).name.removesuffix(".gguf"),
        "model_aliases": list(model_aliases),
        "strict_model": strict_model,
        "api_key": api_key,
    }
    scaling: dict[str, Any]
    if autoscaling_config is not None:
        scaling = {"autoscaling_config": {"target_ongoing_requests": n_seq_max, **autoscaling_config}}
    else:
        scaling = {"num_replicas": num_replicas}
    deployment = serve.deployment(
        name=name,
        max_ongoing_requests=n_seq_max,
        ray_actor_options={"num_cpus": num_cpus},
        **scaling,
    )(LlamaReplica)
    return deployment.bind(str(model_path), engine_options, app_options)


def build(arguments: dict[str, str]) -> Application:
    """``serve run llamactx.ray:build model_path=PATH [num_replicas=N] [n_seq_max=N] [n_ctx=N]
    [num_cpus=N] [model_id=NAME]``: ``app`` from Serve's command-line arguments."""
    options = dict(arguments)
    model_path = options.pop("model_path", None)
    if model_path is None:
        raise ValueError("give model_path=PATH")
    integers = ("num_replicas", "n_ctx", "n_seq_max", "max_waiting", "threads")
    typed: dict[str, Any] = {key: int(value) if key in integers else value for key, value in options.items()}
    if "num_cpus" in typed:
        typed["num_cpus"] = float(typed["num_cpus"])
    return app(model_path, **typed)
