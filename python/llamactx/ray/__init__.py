"""GGUF models on a Ray cluster (``pip install 'llamactx[ray]'``).

- ``Predictor``: a callable class for ``ray.data.Dataset.map_batches(..., concurrency=k)``; each
  actor loads the model once and runs its batches through an ``Engine`` (generate or chat
  rows) or an embedding context. Rows that fail carry an ``error`` instead of failing the job.
- ``app(model_path, ...)``: a Ray Serve application whose replicas each run the
  OpenAI-compatible server (``llamactx.server.create_app``) on an engine of their own;
  ``serve run llamactx.ray:build model_path=...`` starts it from the command line.
"""

try:
    import ray  # noqa: F401  (only to say what is missing)
except ImportError as missing:  # pragma: no cover - the extra is installed wherever tests run
    raise ImportError(f"llamactx.ray needs Ray: pip install 'llamactx[ray]' ({missing})") from missing

from typing import TYPE_CHECKING, Any

from llamactx.ray._data import Predictor, actor_threads

if TYPE_CHECKING:
    from llamactx.ray._serve import app, build

__all__ = ["Predictor", "actor_threads", "app", "build"]


def __getattr__(name: str) -> Any:
    """``app`` and ``build``, imported with Ray Serve when first asked for: a Ray Data actor
    unpickles ``Predictor`` from this package and would otherwise import Serve too (half a second
    of CPU an actor)."""
    if name in ("app", "build"):
        from llamactx.ray import _serve

        return getattr(_serve, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
