"""Tools the tests call, in OpenAI's shape."""

from typing import Any

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
