"""Images in chats: OpenAI's content parts read into bitmaps, and prompts whose text runs are
separated by media, decoded into a sequence through a projector (``MtmdContext``).

A chat with images is rendered by the model's chat template with a random marker in place of
each image, known to nobody else, so no text of a message can place or remove an image; the
rendered prompt is tokenized around the markers (``_ChatApplied.segments``). Such a prompt is
read by the engine's step loop (``MediaPrompt.spans`` gives it the media and where they go).

Media cost far more than their bytes: a 4 KB PNG can claim 2**25 pixels (96 MiB decoded), and a
projector encodes each. A chat's media are therefore bounded together (``MediaBudget``), each
limit checked before what it bounds is paid for, and each medium is tokenized once, when the chat
is prepared, so that its length is known before anything is encoded."""

from __future__ import annotations

import base64
import binascii
import math
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from llamactx._llamactx import ImageError, MtmdBitmap, MtmdContext, MtmdInputChunks, _check_media_ending
from llamactx._tools import ChatInputError

__all__ = [
    "MAX_IMAGE_BYTES",
    "MEDIA_URL_MAX_BYTES",
    "MEDIA_URL_TIMEOUT",
    "MediaBudget",
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
#: The most pixels ``MtmdBitmap.from_buf`` may be asked to decode (``MAX_PIXELS_CEILING`` in
#: ``crates/llamactx-engine/src/media/image_file.rs``).
MAX_PIXELS_CEILING = 2**27
#: The content part types that carry media.
_MEDIA_PARTS = ("image_url", "input_audio")


@dataclass(frozen=True)
class MediaBudget:
    """What the media of one chat may cost, each limit checked before what it bounds is paid for:
    at most ``max_parts`` image and audio parts (counted before any is decoded); at most
    ``max_pixels`` pixels in all its images together (each image is decoded under what those
    before it left, so one past the budget is refused from its header, before any of its pixels
    is decoded); at most ``max_audio_seconds`` of audio in all its clips (each measured once
    decoded, before any is tokenized or encoded). The defaults take one image of
    ``MtmdBitmap.from_buf``'s default size limit, or many ordinary ones. ``ValueError`` for a
    limit out of range (``max_pixels`` is at most 2**27, as for ``from_buf``)."""

    max_parts: int = 16
    max_pixels: int = 2**25
    max_audio_seconds: float = 600.0

    def __post_init__(self) -> None:
        if self.max_parts < 1:
            raise ValueError(f"max_parts must be >= 1, got {self.max_parts}")
        if not 1 <= self.max_pixels <= MAX_PIXELS_CEILING:
            raise ValueError(f"max_pixels must be in 1..={MAX_PIXELS_CEILING}, got {self.max_pixels}")
        if not (math.isfinite(self.max_audio_seconds) and self.max_audio_seconds > 0):
            raise ValueError(f"max_audio_seconds must be a number of seconds > 0, got {self.max_audio_seconds}")


def media_marker() -> str:
    """A marker no message can contain: 128 random bits, new for every chat."""
    return f"<media-{secrets.token_hex(16)}>"


def bitmap_of_url(url: object, max_pixels: int) -> MtmdBitmap:
    """The image of an ``image_url`` part: a ``data:image/...;base64,`` URL, decoded under the
    limits of ``MtmdBitmap.from_buf`` with ``max_pixels`` (``ImageError``). ``ChatInputError``
    for any other URL: llamactx never fetches ``http(s)://`` or reads ``file://`` URLs."""
    if not isinstance(url, str):
        raise ChatInputError("messages", f"an image_url's url must be a string, not {type(url).__name__}")
    match = _DATA_URL.match(url)
    if match is None:
        scheme = url.split(":", 1)[0][:16] if ":" in url else "a path"
        raise ChatInputError(
            "messages", f"image URLs must be data:image/...;base64 URLs; llamactx does not fetch {scheme!r} URLs"
        )
    bitmap = MtmdBitmap.from_buf(_decoded(url[match.end() :], "an image"), max_pixels=max_pixels)
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
    messages: Sequence[Mapping[str, Any] | tuple[str, str]], marker: str, mtmd: MtmdContext | None, budget: MediaBudget
) -> tuple[list[Mapping[str, Any] | tuple[str, str]], list[MtmdInputChunks]]:
    """``messages`` with every list of content parts joined into one text, each image or audio
    part replaced by ``marker``, and the media in order, each tokenized by ``mtmd`` into its
    chunks (its bitmap is not kept). ``ChatInputError`` naming the limit for media past
    ``budget``, ``ValueError`` for media without a projector that reads them, ``ChatInputError``
    for a part llamactx does not read."""
    _check_parts(messages, budget)
    media = _MediaReader(mtmd, budget)
    out: list[Mapping[str, Any] | tuple[str, str]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), list):
            out.append(message)
            continue
        texts: list[str] = []
        for number, part in enumerate(message["content"]):
            kind = part.get("type") if isinstance(part, Mapping) else None
            where = f"messages[{index}].content[{number}]"
            if kind == "text":
                texts.append(str(part.get("text", "")))
            elif kind == "image_url":
                image_url = part.get("image_url")
                media.read_image(image_url.get("url") if isinstance(image_url, Mapping) else image_url, where)
                texts.append(marker)
            elif kind == "input_audio":
                media.read_audio(part.get("input_audio"), where)
                texts.append(marker)
            else:
                raise ChatInputError("messages", f"{where}: content parts of type {kind!r} are not supported")
        out.append({**message, "content": "".join(texts)})
    return out, media.chunks


def _check_parts(messages: Sequence[Mapping[str, Any] | tuple[str, str]], budget: MediaBudget) -> None:
    """``ChatInputError`` for ``messages`` of more image and audio parts than ``budget`` takes,
    before any is decoded."""
    parts = sum(
        1
        for message in messages
        if isinstance(message, Mapping) and isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, Mapping) and part.get("type") in _MEDIA_PARTS
    )
    if parts > budget.max_parts:
        raise ChatInputError(
            "messages",
            f"the chat holds {parts} image and audio parts, more than the {budget.max_parts} one chat may hold "
            "(MediaBudget.max_parts; llamactx serve --max-media-parts)",
        )


class _MediaReader:
    """Reads the media parts of one chat, in order, under its ``MediaBudget``: what the parts
    before took is what the next may not."""

    def __init__(self, mtmd: MtmdContext | None, budget: MediaBudget) -> None:
        self.mtmd = mtmd
        self.budget = budget
        self.pixels = 0
        self.seconds = 0.0
        self.chunks: list[MtmdInputChunks] = []

    def read_image(self, url: object, where: str) -> None:
        """Reads the image of part ``where`` (its ``url``), decoded only if its header claims no
        more pixels than the budget has left."""
        if self.mtmd is None or not self.mtmd.supports_vision():
            raise ValueError(f"{where} is an image, and the model was loaded without a projector that reads images")
        left = self.budget.max_pixels - self.pixels
        try:
            bitmap = bitmap_of_url(url, left)
        except ImageError as error:
            if error.kind != "TooLarge":
                raise
            raise ChatInputError(
                "messages",
                f"{where}: {error}: the images of a chat may hold {self.budget.max_pixels} pixels in all, "
                f"{self.pixels} of them taken by those before it (MediaBudget.max_pixels; llamactx serve "
                "--max-media-pixels)",
            ) from None
        self.pixels += bitmap.nx() * bitmap.ny()
        self._tokenize(self.mtmd, bitmap)

    def read_audio(self, audio: object, where: str) -> None:
        """Reads the clip of part ``where``, refused once decoded if it takes the chat's audio
        past the budget: before it is tokenized or encoded, which cost far more."""
        if self.mtmd is None or not self.mtmd.supports_audio():
            raise ValueError(f"{where} is audio, and the model was loaded without a projector that reads audio")
        rate = self.mtmd.audio_sample_rate()
        bitmap = bitmap_of_audio(audio, rate)
        self.seconds += bitmap.nx() / rate
        if self.seconds > self.budget.max_audio_seconds:
            raise ChatInputError(
                "messages",
                f"{where}: with this clip the chat's audio lasts {self.seconds:.1f} s, more than the "
                f"{self.budget.max_audio_seconds:g} s one chat may hold (MediaBudget.max_audio_seconds; llamactx "
                "serve --max-audio-seconds)",
            )
        self._tokenize(self.mtmd, bitmap)

    def _tokenize(self, mtmd: MtmdContext, bitmap: MtmdBitmap) -> None:
        # Once, here: the chunks give the prompt's length, and every reading decodes from them.
        self.chunks.append(mtmd.tokenize_from_parts([bitmap], add_special=False))


@dataclass(frozen=True)
class MediaPrompt:
    """A prompt of text runs with an image or audio clip between each two, each as the chunks it
    was tokenized into: ``len(texts) == len(chunks) + 1``."""

    texts: list[list[int]]
    chunks: list[MtmdInputChunks]

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.chunks) + 1:
            raise ValueError(f"{len(self.chunks)} media need {len(self.chunks) + 1} text runs, got {len(self.texts)}")
        if self.chunks:
            _check_media_ending(len(self.texts[-1]))

    @property
    def tokens(self) -> list[int]:
        """The text tokens, without the media."""
        return [token for run in self.texts for token in run]

    @property
    def n_tokens(self) -> int:
        """The prompt's length: its text tokens and every medium's (``MtmdInputChunks.n_tokens``)."""
        return sum(map(len, self.texts)) + sum(medium.n_tokens() for medium in self.chunks)

    def spans(self) -> list[tuple[int, MtmdInputChunks]]:
        """Each medium with the text token it goes before, counted in ``tokens`` (the
        ``media`` of ``Engine``'s and the step loop's requests)."""
        starts = accumulate(len(run) for run in self.texts[:-1])
        return list(zip(starts, self.chunks, strict=True))
