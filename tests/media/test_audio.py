"""Audio in prompts: WAV files decoded in Rust, and chats with ``input_audio`` parts, on SmolLM2
with a synthetic Ultravox-style projector (``synthetic.write_tiny_audio_projector``)."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.audio import tone, wav
from support.cpus import threads
from support.processes import comparable_mtmd_cli
from support.synthetic import AUDIO_PROJECTOR_SAMPLE_RATE, AUDIO_PROJECTOR_TOKENS, write_tiny_audio_projector

import llamactx
from llamactx import AudioError, MtmdBitmap, MtmdContext, MtmdInputChunkType

#: Decodes the WAV file argv[1] at the sample rate argv[2] under a 4 GiB address-space limit (an
#: allocation past it aborts the process, as one past the machine's memory would), and prints
#: ``RAISED``, the exception's name and its kind (``RAISED none`` if it returned).
DECODE_IN_A_CHILD = """
import resource, sys
import llamactx
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
with open(sys.argv[1], "rb") as file:
    data = file.read()
try:
    llamactx.MtmdBitmap.from_buf(data, sample_rate=int(sys.argv[2]))
except ValueError as error:
    print("RAISED", type(error).__name__, getattr(error, "kind", None))
else:
    print("RAISED none")
"""


@pytest.fixture(scope="module")
def audio_projector_path(model: llamactx.LlamaModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_audio_projector(tmp_path_factory.mktemp("audio") / "mmproj.gguf", model.n_embd())


@pytest.fixture(scope="module")
def listener(model: llamactx.LlamaModel, audio_projector_path: Path) -> Iterator[MtmdContext]:
    with MtmdContext(model, audio_projector_path, n_threads=threads()) as projector:
        yield projector


def audio_message(text: str, clip: bytes) -> dict[str, Any]:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(clip).decode(), "format": "wav"}}
    return {"role": "user", "content": [part, {"type": "text", "text": text}]}


def test_wav_files_decode_to_mono_samples_at_the_asked_rate() -> None:
    clip = tone(440, 0.5)
    decoded = MtmdBitmap.from_buf(wav(clip))
    assert decoded.is_audio()
    np.testing.assert_allclose(decoded.data(), clip, atol=1e-4)  # 16-bit quantization
    # Stereo at 48 kHz: mixed down (the channels' mean), resampled to 16 kHz.
    stereo = np.stack([tone(440, 0.5, 48_000), np.zeros(24_000, np.float32)], axis=1).reshape(-1)
    resampled = MtmdBitmap.from_buf(wav(stereo, 48_000, 2), sample_rate=16_000)
    assert resampled.nx() == 8_000
    np.testing.assert_allclose(resampled.data(), tone(440, 0.5) / 2, atol=2e-2)


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"RIFF\x00\x00\x00\x00WAVE", "Corrupt"),
        (wav(np.zeros(0, np.float32)), "Empty"),
        (wav(tone(440, 0.5))[:30], "Corrupt"),
        (wav(tone(440, 0.5)).replace(b"\x01\x00\x01\x00", b"\x02\x00\x01\x00", 1), "Unsupported"),
    ],
)
def test_audio_files_that_are_refused(data: bytes, kind: str) -> None:
    with pytest.raises(AudioError) as raised:
        MtmdBitmap.from_buf(data)
    assert raised.value.kind == kind
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize(
    ("seconds", "rate", "sample_rate", "raised"),
    [
        # One second asked at 4 GHz: 16 GB of samples once resampled.
        (1, 16_000, 4_000_000_000, "ValueError None"),
        (1, 16_000, 0, "ValueError None"),
        # Ten minutes of a 1 Hz header asked at 768 kHz: 460,800,000 samples (1.8 GB).
        (600, 1, 768_000, "AudioError TooLong"),
        (601, 1, 16_000, "AudioError TooLong"),
        (600, 1, 16_000, "none"),
    ],
)
def test_a_clip_is_measured_at_the_asked_rate_before_it_is_resampled(
    tmp_path: Path, seconds: int, rate: int, sample_rate: int, raised: str
) -> None:
    (tmp_path / "clip.wav").write_bytes(wav(np.zeros(seconds * rate, np.float32), rate))
    ran = subprocess.run(
        [sys.executable, "-c", DECODE_IN_A_CHILD, str(tmp_path / "clip.wav"), str(sample_rate)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, f"child died with {ran.returncode}: {ran.stderr[-2000:]}"
    assert ran.stdout.split("RAISED ", 1)[1].strip() == raised, ran.stderr[-2000:]


def long_clip() -> np.ndarray:
    """45 s in two 30-second chunks that differ: one tone, then another for 15 s."""
    return np.concatenate([tone(440, 30), tone(3000, 15)])


def test_every_chunk_of_a_long_clip_gets_its_own_embeddings(listener: MtmdContext, model: llamactx.LlamaModel) -> None:
    """mtmd gives every chunk of a clip the clip's id: each chunk is still encoded, and an
    evaluation that keeps them gives the logits of one that keeps nothing."""
    named = MtmdBitmap.from_audio(long_clip())
    unnamed = MtmdBitmap.from_audio(long_clip())
    unnamed.set_id("")  # media without an id are never kept: each chunk is encoded afresh

    with model.new_context(n_ctx=512, n_threads=threads(), n_threads_batch=threads()) as ctx:

        def evaluate(bitmap: MtmdBitmap) -> tuple[llamactx.MtmdInputChunks, int, np.ndarray]:
            chunks = listener.tokenize_from_parts(["Hear: ", bitmap, " What is it?"])
            ctx.clear_kv_cache()
            encodes = listener.n_encodes()
            listener.eval_chunks(ctx, chunks, 0)
            return chunks, listener.n_encodes() - encodes, ctx.get_logits_ith(-1).copy()

        chunks, encoded, logits = evaluate(named)
        clip = [chunk for chunk in chunks if chunk.chunk_type() == MtmdInputChunkType.AUDIO]
        assert len(clip) == 2
        assert len({chunk.id() for chunk in clip}) == 1
        assert encoded == len(clip)
        _, _, fresh = evaluate(unnamed)
        np.testing.assert_allclose(logits, fresh, atol=1e-5)
        # Evaluated again, each chunk takes the embeddings kept of it.
        _, encoded_again, again = evaluate(named)
        assert encoded_again == 0
        np.testing.assert_allclose(again, logits, atol=1e-5)


def test_the_engine_encodes_every_chunk_of_a_long_clip(model: llamactx.LlamaModel, audio_projector_path: Path) -> None:
    with (
        MtmdContext(model, audio_projector_path, n_threads=threads()) as projector,
        llamactx.Engine(model, mtmd=projector, n_ctx=1024, n_seq_max=1, n_threads=threads()) as engine,
    ):
        engine.submit_chat([audio_message("What do you hear?", wav(long_clip()))], max_tokens=2).result()
        assert projector.n_encodes() == 2


def test_an_audio_projector_reads_clips(listener: MtmdContext) -> None:
    assert listener.supports_audio()
    assert not listener.supports_vision()
    assert listener.audio_sample_rate() == AUDIO_PROJECTOR_SAMPLE_RATE
    chunks = listener.tokenize_from_parts(["Hear: ", MtmdBitmap.from_buf(wav(tone(440, 1))), " now"])
    assert [chunk.chunk_type() for chunk in chunks][1] == llamactx.MtmdInputChunkType.AUDIO
    assert chunks[1].n_tokens() == AUDIO_PROJECTOR_TOKENS


def test_clips_change_the_reply_and_equal_llama_mtmd_cli(
    listener: MtmdContext, model: llamactx.LlamaModel, model_path: Path, audio_projector_path: Path, tmp_path: Path
) -> None:
    clips = [wav(tone(440, 1)), wav(tone(3000, 1))]
    with model.new_context(n_ctx=512, n_threads=threads(), n_threads_batch=threads()) as ctx:
        replies = [
            llamactx.chat(ctx, [audio_message("What do you hear?", clip)], max_tokens=12, mtmd=listener)
            for clip in clips
        ]
        assert replies[0] != replies[1]
        cli = comparable_mtmd_cli()
        (tmp_path / "clip.wav").write_bytes(clips[0])
        ran = subprocess.run(
            [
                *(str(cli), "-m", str(model_path), "--mmproj", str(audio_projector_path), "--audio"),
                *(str(tmp_path / "clip.wav"), "-p", "What do you hear?", "-n", "16", "--temp", "0"),
                *("-t", str(threads())),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        rendered = model.apply_chat_template([("user", f"{listener.marker()}What do you hear?")], None, True)
        chunks = listener.tokenize(rendered, [MtmdBitmap.from_buf(clips[0])], add_special=model.add_bos_token())
        ctx.clear_kv_cache()
        history = [0] * listener.eval_chunks(ctx, chunks, 0, 0)
        greedy = llamactx.LlamaSampler.greedy()
        ours = "".join(llamactx.continue_sequence(ctx, history, max_tokens=16, sampler=greedy))
    assert ran.stdout.strip() == ours.strip()


def test_the_engine_replies_to_a_clip_as_chat_does(listener: MtmdContext, model: llamactx.LlamaModel) -> None:
    messages = [audio_message("What do you hear?", wav(tone(660, 1)))]
    with model.new_context(n_ctx=512, n_threads=threads(), n_threads_batch=threads()) as ctx:
        expected = llamactx.chat(ctx, messages, max_tokens=10, mtmd=listener)
    with llamactx.Engine(model, mtmd=listener, n_ctx=1024, n_seq_max=2, n_threads=threads()) as engine:
        assert engine.submit_chat(messages, max_tokens=10).result().text == expected


@pytest.mark.parametrize(
    ("part", "error"),
    [
        ({"data": base64.b64encode(b"ID3\x04").decode(), "format": "mp3"}, "only WAV"),
        ({"data": base64.b64encode(b"not a wav").decode(), "format": "wav"}, "not a WAV file"),
        ({"data": "!!!", "format": "wav"}, "malformed"),
        ({"format": "wav"}, "needs"),
    ],
)
def test_audio_parts_that_are_refused(
    listener: MtmdContext, small_audio_ctx: llamactx.LlamaContext, part: dict[str, str], error: str
) -> None:
    message = {"role": "user", "content": [{"type": "input_audio", "input_audio": part}]}
    with pytest.raises(ValueError, match=error):
        llamactx.chat(small_audio_ctx, [message], mtmd=listener)


def test_audio_needs_a_projector_that_reads_it(mtmd: MtmdContext, small_audio_ctx: llamactx.LlamaContext) -> None:
    message = audio_message("What do you hear?", wav(tone(440, 1)))
    with pytest.raises(ValueError, match="without a projector that reads audio"):
        llamactx.chat(small_audio_ctx, [message], mtmd=mtmd)  # a vision projector


@pytest.fixture
def small_audio_ctx(model: llamactx.LlamaModel) -> Iterator[llamactx.LlamaContext]:
    with model.new_context(n_ctx=256, n_threads=threads()) as ctx:
        yield ctx


def test_an_image_part_holding_audio_is_refused(mtmd: MtmdContext, small_audio_ctx: llamactx.LlamaContext) -> None:
    url = "data:image/png;base64," + base64.b64encode(wav(tone(440, 1))).decode()
    message = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}
    with pytest.raises(ValueError, match="input_audio part"):
        llamactx.chat(small_audio_ctx, [message], mtmd=mtmd)


def test_a_chat_s_clips_share_one_budget_of_seconds(
    listener: MtmdContext, small_audio_ctx: llamactx.LlamaContext
) -> None:
    clip = audio_message("", wav(tone(440, 1)))["content"][0]
    one_and_a_half = llamactx.MediaBudget(max_audio_seconds=1.5)
    two = [{"role": "user", "content": [clip, clip, {"type": "text", "text": "What do you hear?"}]}]
    refusal = r"content\[1\]: with this clip the chat's audio lasts 2\.0 s, more than the 1\.5 s one chat may hold"
    with pytest.raises(ValueError, match=rf"{refusal} .*--max-audio-seconds"):
        llamactx.chat(small_audio_ctx, two, mtmd=listener, media_budget=one_and_a_half)
    # One clip is within it, and two are within the default.
    llamactx.chat(small_audio_ctx, two, max_tokens=1, mtmd=listener, media_budget=llamactx.MediaBudget())
    one = [{"role": "user", "content": [clip, {"type": "text", "text": "What do you hear?"}]}]
    llamactx.chat(small_audio_ctx, one, max_tokens=1, mtmd=listener, media_budget=one_and_a_half)
