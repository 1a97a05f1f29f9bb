"""WAV files written with the standard library's ``wave`` module."""

from __future__ import annotations

import io
import wave

import numpy as np


def tone(frequency: float, seconds: float, rate: int = 16_000) -> np.ndarray:
    """A sine tone in -0.5..0.5 as float32 samples."""
    return (0.5 * np.sin(2 * np.pi * frequency * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def wav(samples: np.ndarray, rate: int = 16_000, channels: int = 1) -> bytes:
    """``samples`` (float, interleaved when ``channels`` > 1) as a 16-bit PCM WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(channels)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()
