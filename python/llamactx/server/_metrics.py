"""``GET /metrics``: Prometheus counters and histograms of the server's requests, and the
engine's own gauges (running and waiting requests, KV cells) read at each scrape."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llamactx._engine import Engine
from llamactx._llamactx import Completion

__all__ = ["ServerMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

_ENGINE_GAUGES = {
    "running": "Requests decoding now",
    "waiting": "Requests waiting for a sequence slot",
    "kv_cells_used": "KV cells held by running requests",
    "kv_cells_cached": "KV cells kept for prefix reuse",
    "kv_cells_total": "KV cells of the context",
    "n_seq_max": "Requests that can run at once",
    "tokens_per_second": "Generated tokens per second of engine work",
}
_ENGINE_COUNTERS = {
    "prefix_cache_hits": "Requests that reused cached prompt tokens",
    "tokens_generated": "Tokens generated",
    "prompt_tokens_computed": "Prompt tokens decoded (not reused)",
    "drafted_tokens": "Tokens proposed by speculative drafts and verified",
    "accepted_tokens": "Drafted tokens the model accepted (each saved a decode)",
}


class _EngineCollector(Collector):
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.stats()
        for name, help_text in _ENGINE_GAUGES.items():
            yield GaugeMetricFamily(f"llamactx_engine_{name}", help_text, value=getattr(stats, name))
        for name, help_text in _ENGINE_COUNTERS.items():
            yield CounterMetricFamily(f"llamactx_engine_{name}", help_text, value=getattr(stats, name))


class ServerMetrics:
    """One registry per app, so two apps in a process do not mix their numbers."""

    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        self.requests = Counter(
            "llamactx_requests", "HTTP requests by route and status", ["route", "status"], registry=self.registry
        )
        self.prompt_tokens = Counter("llamactx_prompt_tokens", "Prompt tokens received", registry=self.registry)
        self.cached_tokens = Counter(
            "llamactx_cached_prompt_tokens", "Prompt tokens whose KV was reused", registry=self.registry
        )
        self.completion_tokens = Counter(
            "llamactx_completion_tokens", "Tokens generated for clients", registry=self.registry
        )
        self.duration = Histogram(
            "llamactx_request_duration_seconds",
            "Time from request to response end, by route",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue = Histogram(
            "llamactx_queue_seconds",
            "Time a request waited for a slot",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.first_token = Histogram(
            "llamactx_time_to_first_token_seconds",
            "Time from submit to the first token",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def record(self, completion: Completion, *, prompt_counted: bool) -> None:
        """Counts one finished generation (its prompt once per prompt, not per choice)."""
        if prompt_counted:
            self.prompt_tokens.inc(completion.prompt_tokens)
            self.cached_tokens.inc(completion.cached_tokens)
        self.completion_tokens.inc(completion.completion_tokens)
        self.queue.observe(completion.queue_seconds)
        if completion.first_token_seconds is not None:
            self.first_token.observe(completion.first_token_seconds)
