"""Images in chats: OpenAI's content parts read into bitmaps, and prompts whose text runs are
separated by media, decoded into a sequence through a projector (``MtmdContext``).

A chat with images is rendered by the model's chat template with a random marker in place of
each image, known to nobody else, so no text of a message can place or remove an image; the
rendered prompt is tokenized around the markers (``_ChatApplied.segments``). Decoding such a
prompt is ``_generation.prefill_media``."""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llamactx._llamactx import MtmdBitmap, MtmdContext
from llamactx._tools import ChatInputError

__all__ = [
    "MAX_IMAGE_BYTES",
    "MEDIA_POSITION",
    "MEDIA_URL_MAX_BYTES",
    "MEDIA_URL_TIMEOUT",
    "MediaPrompt",
    "bitmap_of_audio",
    "bitmap_of_url",
    "media_marker",
    "with_media_markers",
]

#: The largest image or audio file a content part may carry (decoded from base64).
MAX_IMAGE_BYTES = 20 * 1024 * 1024
#: What a server fetches for a request's image URLs, where allowed (``MediaUrlPolicy``): at most
#: these bytes, within these seconds, all of its URLs together.
MEDIA_URL_MAX_BYTES = 10 * 1024 * 1024
MEDIA_URL_TIMEOUT = 10.0
_DATA_URL = re.compile(r"data:image/[a-z0-9.+-]+;base64,", re.IGNORECASE)
#: Stands, in a sequence's history, for each position an image takes: no token id is negative.
MEDIA_POSITION = -1


def media_marker() -> str:
    """A marker no message can contain: 128 random bits, new for every chat."""
    return f"<media-{secrets.token_hex(16)}>"


def bitmap_of_url(url: object) -> MtmdBitmap:
    """The image of an ``image_url`` part: a ``data:image/...;base64,`` URL, decoded under the
    limits of ``MtmdBitmap.from_buf`` (``ImageError``). ``ChatInputError`` for any other URL:
    llamactx never fetches ``http(s)://`` or reads ``file://`` URLs."""
    if not isinstance(url, str):
        raise ChatInputError("messages", f"an image_url's url must be a string, not {type(url).__name__}")
    match = _DATA_URL.match(url)
    if match is None:
        scheme = url.split(":", 1)[0][:16] if ":" in url else "a path"
        raise ChatInputError(
            "messages", f"image URLs must be data:image/...;base64 URLs; llamactx does not fetch {scheme!r} URLs"
        )
    bitmap = MtmdBitmap.from_buf(_decoded(url[match.end() :], "an image"))
    if bitmap.is_audio():
        raise ChatInputError("messages", "an image_url part holds a WAV file: send audio as an input_audio part")
    return bitmap


def bitmap_of_audio(audio: object, sample_rate: int) -> MtmdBitmap:
    """The clip of an ``input_audio`` part (``{"data": base64, "format": "wav"}``), mixed down
    to mono and resampled to ``sample_rate`` (``AudioError`` for a WAV file refused);
    ``ChatInputError`` for another format or data that is no WAV file."""
    if not isinstance(audio, Mapping) or not isinstance(audio.get("data"), str):
        raise ChatInputError("messages", 'an input_audio part needs {"data": base64 text, "format": "wav"}')
    if audio.get("format", "wav") != "wav":
        raise ChatInputError("messages", f"only WAV audio is read, not {str(audio.get('format'))[:16]!r}")
    data = _decoded(audio["data"], "an audio clip")
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ChatInputError("messages", "an input_audio part's data is not a WAV file")
    return MtmdBitmap.from_buf(data, sample_rate=sample_rate)


def _decoded(encoded: str, what: str) -> bytes:
    """The bytes of base64 ``encoded``, at most ``MAX_IMAGE_BYTES`` of them."""
    if len(encoded) > (MAX_IMAGE_BYTES // 3 + 1) * 4:
        raise ChatInputError("messages", f"{what} may hold at most {MAX_IMAGE_BYTES} bytes")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ChatInputError("messages", f"{what}'s base64 data is malformed: {err}") from None


def with_media_markers(
    messages: Sequence[Mapping[str, Any] | tuple[str, str]], marker: str, mtmd: MtmdContext | None
) -> tuple[list[Mapping[str, Any] | tuple[str, str]], list[MtmdBitmap]]:
    """``messages`` with every list of content parts joined into one text, each image or audio
    part replaced by ``marker``, and the bitmaps in order. ``ValueError`` for media without a
    projector that reads them, ``ChatInputError`` for a part llamactx does not read."""
    out: list[Mapping[str, Any] | tuple[str, str]] = []
    bitmaps: list[MtmdBitmap] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), list):
            out.append(message)
            continue
        content = message["content"]
        texts: list[str] = []
        for number, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            where = f"messages[{index}].content[{number}]"
            if kind == "text":
                texts.append(str(part.get("text", "")))
            elif kind == "image_url":
                if mtmd is None or not mtmd.supports_vision():
                    raise ValueError(
                        f"{where} is an image, and the model was loaded without a projector that reads images"
                    )
                image_url = part.get("image_url")
                url = image_url.get("url") if isinstance(image_url, Mapping) else image_url
                bitmaps.append(bitmap_of_url(url))
                texts.append(marker)
            elif kind == "input_audio":
                if mtmd is None or not mtmd.supports_audio():
                    raise ValueError(f"{where} is audio, and the model was loaded without a projector that reads audio")
                bitmaps.append(bitmap_of_audio(part.get("input_audio"), mtmd.audio_sample_rate()))
                texts.append(marker)
            else:
                raise ChatInputError("messages", f"{where}: content parts of type {kind!r} are not supported")
        out.append({**message, "content": "".join(texts)})
    return out, bitmaps


@dataclass(frozen=True)
class MediaPrompt:
    """A prompt of text runs with an image between each two: ``len(texts) == len(bitmaps) + 1``."""

    texts: list[list[int]]
    bitmaps: list[MtmdBitmap]

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.bitmaps) + 1:
            raise ValueError(
                f"{len(self.bitmaps)} images need {len(self.bitmaps) + 1} text runs, got {len(self.texts)}"
            )
        if not self.texts[-1]:
            raise ValueError("a prompt must end with text after its last image")

    @property
    def tokens(self) -> list[int]:
        """The text tokens, without the images."""
        return [token for run in self.texts for token in run]

    def keys(self) -> list[int | str]:
        """The prompt as a sequence of comparable items: token ids, and each image's id once."""
        items: list[int | str] = list(self.texts[0])
        for bitmap, run in zip(self.bitmaps, self.texts[1:], strict=True):
            items.append(bitmap.id() or "")
            items += run
        return items
