"""``SamplingParams`` is declared once (``crates/llamactx-engine/src/sampler/params.rs``): its constructor, defaults,
pickling and ``repr`` come from that declaration, and the server's request fields, the command
line's options and Ray's columns take its fields and defaults from the constructor's signature."""

from __future__ import annotations

import math
import pickle
from types import SimpleNamespace

import pytest

import llamactx
from llamactx import cli
from llamactx._sampling import SAMPLING_DEFAULTS
from llamactx.server._openai_protocol import ChatRequest, SamplingBody
from llamactx.server._pipeline import Pipeline

#: A value for every field, none of them its default.
EVERY_FIELD = {
    "temperature": 0.5,
    "top_k": 7,
    "top_p": 0.75,
    "min_p": 0.125,
    "typical_p": 0.5,
    "repeat_penalty": 1.25,
    "frequency_penalty": 0.5,
    "presence_penalty": -0.5,
    "penalty_last_n": 32,
    "logit_bias": {3: -1.5},
    "seed": 11,
}


def test_the_declaration_gives_the_constructor_its_fields_and_defaults() -> None:
    assert list(SAMPLING_DEFAULTS) == list(EVERY_FIELD)
    params = llamactx.SamplingParams()
    for name, default in SAMPLING_DEFAULTS.items():
        kept = getattr(params, name)
        if name == "logit_bias":
            assert default is None
            assert kept == {}
        elif default is None:
            assert kept is None
        else:
            assert math.isclose(kept, default, rel_tol=1e-6), name  # kept as f32
    assert repr(params).startswith("SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,")


def test_every_field_is_kept_pickled_and_shown() -> None:
    params = llamactx.SamplingParams(**EVERY_FIELD)
    assert {name: getattr(params, name) for name in EVERY_FIELD} == EVERY_FIELD  # exact in f32 too
    again = pickle.loads(pickle.dumps(params))
    assert {name: getattr(again, name) for name in EVERY_FIELD} == EVERY_FIELD
    assert repr(params) == (
        "SamplingParams(temperature=0.5, top_k=7, top_p=0.75, min_p=0.125, typical_p=0.5, repeat_penalty=1.25, "
        "frequency_penalty=0.5, presence_penalty=-0.5, penalty_last_n=32, logit_bias={3: -1.5}, seed=11)"
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", -1.0, "temperature must be >= 0"),
        ("top_k", -1, "top_k must be >= 0"),
        ("top_p", 1.5, r"top_p must be in \[0, 1\]"),
        ("min_p", -0.1, r"min_p must be in \[0, 1\]"),
        ("typical_p", math.nan, r"typical_p must be in \[0, 1\]"),
        ("repeat_penalty", math.inf, "repeat_penalty must be a finite number"),
        ("frequency_penalty", math.nan, "frequency_penalty must be a finite number"),
        ("presence_penalty", -math.inf, "presence_penalty must be a finite number"),
        ("penalty_last_n", -1, "penalty_last_n must be in 0..="),
        ("logit_bias", {5: math.nan}, "the bias of token 5 is NaN"),
        ("seed", 2**32 - 1, "pass None for that"),
    ],
)
def test_each_field_is_checked_by_its_declared_check(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        llamactx.SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_the_server_and_the_command_line_default_to_the_declared_values() -> None:
    fields = SamplingBody.model_fields
    shared = [name for name in SAMPLING_DEFAULTS if name in fields]
    assert shared == [name for name in SAMPLING_DEFAULTS if name != "penalty_last_n"]  # repeat_last_n, below
    for name in shared:
        assert fields[name].default == SAMPLING_DEFAULTS[name], name
    assert fields["repeat_last_n"].default == SAMPLING_DEFAULTS["penalty_last_n"]
    options = cli._parser().parse_args(["generate", "Hello"])
    assert (options.temp, options.top_k, options.top_p, options.min_p) == tuple(
        SAMPLING_DEFAULTS[name] for name in ("temperature", "top_k", "top_p", "min_p")
    )


def test_the_server_passes_every_sampling_field_of_a_request_on() -> None:
    body = {name: value for name, value in EVERY_FIELD.items() if name != "penalty_last_n"}
    body["logit_bias"] = {"3": -1.5}
    request = ChatRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}], "repeat_last_n": 32, **body})
    pipeline = SimpleNamespace(engine=SimpleNamespace(n_ctx_seq=512))
    params = Pipeline.sampling(pipeline, request, 0)  # type: ignore[arg-type]
    assert {name: getattr(params, name) for name in EVERY_FIELD} == EVERY_FIELD
    assert Pipeline.sampling(pipeline, request, 2).seed == 13  # type: ignore[arg-type]  # choice 2 of n


def test_ray_rows_may_set_every_field_but_the_biases() -> None:
    pytest.importorskip("ray", reason="the [ray] extra is not installed (make test installs it)")
    from llamactx.ray import _data as ray_data

    assert tuple(name for name in EVERY_FIELD if name != "logit_bias") == ray_data.SAMPLING_COLUMNS
    assert {"max_tokens", "top_k", "penalty_last_n", "seed"} == ray_data.INTEGER_COLUMNS
