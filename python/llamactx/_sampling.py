"""``SamplingParams``' fields and their defaults (llama.cpp's), read from its one declaration in
Rust (the constructor's signature) by the server, the command line and Ray, so that a default
or a new field is written once."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from llamactx._llamactx import SamplingParams

__all__ = ["SAMPLING_DEFAULTS"]

#: Each field of ``SamplingParams``, in its order, with its default.
SAMPLING_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {name: parameter.default for name, parameter in inspect.signature(SamplingParams).parameters.items()}
)
