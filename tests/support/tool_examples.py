"""Tools the tests call, in OpenAI's shape."""

from typing import Any

import pydantic

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME: Any = {"type": "function", "function": {"name": "get_time"}}
ASK_WEATHER: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


class Address(pydantic.BaseModel):
    city: str
    country: str


class Shipment(pydantic.BaseModel):
    """Tool parameters with a nested model: pydantic refers to it through ``$defs``."""

    to: Address
    weight_kg: int


SHIP: Any = {"type": "function", "function": {"name": "ship", "parameters": Shipment.model_json_schema()}}
ASK_SHIPMENT: Any = [{"role": "user", "content": "Ship 3 kg to Paris, France."}]
