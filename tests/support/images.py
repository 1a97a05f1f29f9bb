"""Image files written by hand (no imaging library in the test environment)."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

import numpy as np

from support.synthetic import PROJECTOR_IMAGE_SIZE

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: Channels of each 8-bit PNG colour type: grey, RGB, grey + alpha, RGBA.
PNG_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header(width: int, height: int, colour: int = 2) -> bytes:
    """A PNG's signature and header chunk, claiming ``width x height`` pixels."""
    return PNG_SIGNATURE + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0))


def png(image: np.ndarray) -> bytes:
    """``image`` ((H, W, C) uint8, C of 1 to 4 channels) as an 8-bit PNG file."""
    height, width, channels = image.shape
    colour = {channels: colour for colour, channels in PNG_CHANNELS.items()}[channels]
    raw = b"".join(b"\x00" + image[row].tobytes() for row in range(height))
    return png_header(width, height, colour) + png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b"")


def random_png(width: int, height: int, colour: int, seed: int = 0) -> bytes:
    """A PNG of random pixels in one of the ``PNG_CHANNELS`` colour types."""
    rng = np.random.default_rng(seed)
    return png(rng.integers(0, 256, (height, width, PNG_CHANNELS[colour]), dtype=np.uint8))


def picture(seed: int, size: int = PROJECTOR_IMAGE_SIZE) -> np.ndarray:
    """Random RGB pixels, the synthetic projector's size by default."""
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def data_url(image: np.ndarray) -> str:
    return "data:image/png;base64," + base64.b64encode(png(image)).decode()


def image_message(text: str, *images: np.ndarray) -> dict[str, Any]:
    """A user message of OpenAI's content parts: the images (as data URLs), then ``text``."""
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": data_url(image)}} for image in images]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}
