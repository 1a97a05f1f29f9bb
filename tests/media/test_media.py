"""Images in prompts: the low-level mtmd path (bitmaps, chunks, eval_chunks into a context) and
chats with images, on SmolLM2 with a synthetic LLaVA-style projector (``synthetic.py``)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from support.cpus import threads
from support.images import data_url, image_message, picture, png, png_header
from support.processes import comparable_mtmd_cli
from support.serving import ENGINE_OPTIONS, HEALTH_SECONDS, MODEL_ID, Server, running_server, while_polling_health
from support.synthetic import PROJECTOR_TOKENS

import llamactx
from llamactx import ImageError, MtmdBitmap, MtmdContext, MtmdInputChunkType

# The module takes about 35 s of a parallel worker: started first (with the other long ones),
# so that it does not run alone at the end of the pass.
pytestmark = pytest.mark.long


@pytest.fixture
def small_ctx(model: llamactx.LlamaModel) -> Any:
    with model.new_context(n_ctx=512, n_batch=512, n_threads=threads(), n_threads_batch=threads()) as ctx:
        yield ctx


def test_bitmaps_hold_what_they_were_given() -> None:
    image = picture(1, 5)[:3]
    bitmap = MtmdBitmap.from_rgb(image)
    assert (bitmap.nx(), bitmap.ny(), bitmap.n_bytes(), bitmap.is_audio()) == (5, 3, 45, False)
    assert np.array_equal(bitmap.data(), image)
    decoded = MtmdBitmap.from_buf(png(image))
    assert np.array_equal(decoded.data(), image)
    # The same pixels, however they arrived, have the same id; other pixels another.
    assert decoded.id() == bitmap.id()
    assert MtmdBitmap.from_rgb(picture(2, 5)[:3]).id() != bitmap.id()
    samples = np.sin(np.arange(16000, dtype=np.float32) / 10)
    audio = MtmdBitmap.from_audio(samples)
    assert audio.is_audio()
    assert np.array_equal(audio.data(), samples)


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"", "NotAnImage"),
        (b"hello, world", "NotAnImage"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "NotAnImage"),
        (png(picture(3, 16))[:60], "Corrupt"),
        (b"\xff\xd8\xff\xe0" + bytes(20), "Corrupt"),
        (b"GIF89a" + bytes(7), "Corrupt"),
        (b"BM" + bytes(60), "Corrupt"),
    ],
)
def test_image_bytes_that_are_no_image_are_refused(data: bytes, kind: str) -> None:
    with pytest.raises(ImageError) as raised:
        MtmdBitmap.from_buf(data)
    assert raised.value.kind == kind
    assert isinstance(raised.value, ValueError)


def test_an_image_over_the_pixel_limit_is_refused_from_its_header() -> None:
    # A PNG header claiming 100000 x 100000 pixels, with no pixel data: refused before decoding.
    claimed = png_header(100_000, 100_000)
    with pytest.raises(ImageError) as raised:
        MtmdBitmap.from_buf(claimed)
    assert raised.value.kind == "TooLarge"
    with pytest.raises(ImageError, match="limit of 100") as small:
        MtmdBitmap.from_buf(png(picture(4, 16)), max_pixels=100)
    assert small.value.kind == "TooLarge"
    with pytest.raises(ValueError, match="at most 134217728"):
        MtmdBitmap.from_buf(claimed, max_pixels=2**40)


@pytest.mark.parametrize(
    "array",
    [np.zeros((4, 4), np.uint8), np.zeros((4, 4, 4), np.uint8), np.zeros((0, 4, 3), np.uint8)],
)
def test_arrays_that_are_no_rgb_image_are_refused(array: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"shape|no pixels"):
        MtmdBitmap.from_rgb(array)


def test_audio_outside_its_bounds_is_refused() -> None:
    with pytest.raises(ValueError, match="samples"):
        MtmdBitmap.from_audio(np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="finite"):
        MtmdBitmap.from_audio(np.full(16000, np.nan, np.float32))


def test_a_projector_reports_what_it_reads(mtmd: MtmdContext, model: llamactx.LlamaModel) -> None:
    assert mtmd.supports_vision()
    assert not mtmd.supports_audio()
    assert mtmd.audio_sample_rate() == -1
    assert not mtmd.decode_use_mrope()
    assert mtmd.marker() == MtmdContext.default_marker() == "<__media__>"
    assert mtmd.model is model


def test_a_file_that_is_no_projector_is_refused(model: llamactx.LlamaModel, model_path: Path) -> None:
    with pytest.raises(llamactx.MtmdError) as raised:
        MtmdContext(model, model_path)
    assert raised.value.kind == "InvalidProjector"
    assert "is no projector: it has neither a vision nor an audio encoder" in str(raised.value)


def test_tokenize_splices_each_image_where_its_marker_stands(mtmd: MtmdContext, model: llamactx.LlamaModel) -> None:
    bitmap = MtmdBitmap.from_rgb(picture(5))
    chunks = mtmd.tokenize("Look: <__media__> What is it?", [bitmap], add_special=False)
    kinds = [chunk.chunk_type() for chunk in chunks]
    assert kinds == [MtmdInputChunkType.TEXT, MtmdInputChunkType.IMAGE, MtmdInputChunkType.TEXT]
    assert chunks[0].text_tokens() == model.str_to_token("Look: ", False)
    assert chunks[1].n_tokens() == chunks[1].n_pos() == PROJECTOR_TOKENS
    assert chunks[1].id() == bitmap.id()
    assert chunks[1].text_tokens() is None
    assert chunks.n_tokens() == sum(chunk.n_tokens() for chunk in chunks)
    with pytest.raises(llamactx.MtmdError) as raised:
        mtmd.tokenize("two markers <__media__> <__media__>", [bitmap])
    assert raised.value.kind == "TokenizeError"
    # From parts, a marker in the text is text: no image is spliced there.
    parts = mtmd.tokenize_from_parts(["a <__media__> b ", bitmap, " c"], add_special=False)
    assert [chunk.chunk_type() for chunk in parts] == kinds
    with pytest.raises(IndexError):
        chunks[3]


def test_a_prompt_must_end_with_text_after_its_last_image(mtmd: MtmdContext, model: llamactx.LlamaModel) -> None:
    """One rule, in Rust, for a ``MediaPrompt`` (chat, ``ChatSession``) and the engine's prompts:
    generation starts from the last token's logits, which an image's embeddings have none of."""
    image = mtmd.tokenize_from_parts([MtmdBitmap.from_rgb(picture(0))], add_special=False)
    text = model.str_to_token("What is it?", False)
    with pytest.raises(ValueError, match="must end with text after its last image"):
        llamactx._media.MediaPrompt([text, []], [image])
    assert llamactx._media.MediaPrompt([text, text], [image]).n_tokens == 2 * len(text) + image.n_tokens()
    with llamactx.Engine(model, mtmd=mtmd, **ENGINE_OPTIONS) as engine:
        with pytest.raises(ValueError, match="must end with text after its last image"):
            engine._core.submit(text, 4, [], None, 0, None, [(len(text), image)])
        assert engine._core.submit(text, 1, [], None, 0, None, [(0, image)]).result().completion_tokens == 1


def test_eval_chunks_equals_decoding_the_image_embeddings_in_pieces(
    mtmd: MtmdContext, model: llamactx.LlamaModel, small_ctx: llamactx.LlamaContext
) -> None:
    chunks = mtmd.tokenize("Look: <__media__> What is it?", [MtmdBitmap.from_rgb(picture(6))])
    end = mtmd.eval_chunks(small_ctx, chunks, 0, 0)
    assert end == chunks.n_pos()
    assert small_ctx.kv_cache_seq_pos_max(0) == end - 1
    whole = small_ctx.get_logits_ith(-1).copy()
    # The same prompt with n_batch 4: the image's 16 embeddings in four decodes.
    with model.new_context(n_ctx=512, n_batch=4, n_ubatch=4, n_threads=threads(), n_threads_batch=threads()) as pieces:
        assert mtmd.eval_chunks(pieces, chunks, 0, 0) == end
        np.testing.assert_allclose(pieces.get_logits_ith(-1), whole, atol=1e-3)


def test_eval_chunks_is_all_or_nothing(mtmd: MtmdContext, small_ctx: llamactx.LlamaContext) -> None:
    chunks = mtmd.tokenize("<__media__> hi", [MtmdBitmap.from_rgb(picture(7))])
    first_end = mtmd.eval_chunks(small_ctx, chunks, 0, 0)
    with pytest.raises(ValueError, match=f"continue it at {first_end}, not at 5"):
        mtmd.eval_chunks(small_ctx, chunks, 5, 0)
    with pytest.raises(ValueError, match="seq_id"):
        mtmd.eval_chunks(small_ctx, chunks, 0, 99)
    # 512 cells: the prompt that does not fit leaves the sequence as it was.
    small_ctx.clear_kv_cache()
    end, failure = 0, None
    for _ in range(40):
        try:
            end = mtmd.eval_chunks(small_ctx, chunks, end, 0)
        except llamactx.DecodeError as error:
            failure = error
            break
    assert failure is not None
    assert failure.kind == "NoKvCacheSlot"
    assert small_ctx.kv_cache_seq_pos_max(0) == end - 1


def test_chunks_go_with_their_own_projector_and_model(
    mtmd: MtmdContext,
    projector_path: Path,
    model: llamactx.LlamaModel,
    draft_model: llamactx.LlamaModel,
    small_ctx: llamactx.LlamaContext,
) -> None:
    chunks = mtmd.tokenize("<__media__> hi", [MtmdBitmap.from_rgb(picture(8))])
    with MtmdContext(model, projector_path) as other, pytest.raises(ValueError, match="another MtmdContext"):
        other.eval_chunks(small_ctx, chunks, 0, 0)
    with draft_model.new_context(n_ctx=256) as foreign, pytest.raises(ValueError, match="another model"):
        mtmd.eval_chunks(foreign, chunks, 0, 0)
    closed = MtmdContext(model, projector_path)
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        closed.supports_vision()


def test_images_change_the_reply_and_the_same_image_gives_the_same_one(
    mtmd: MtmdContext, small_ctx: llamactx.LlamaContext
) -> None:
    replies = [
        llamactx.chat(small_ctx, [image_message("Describe the image.", picture(seed))], max_tokens=12, mtmd=mtmd)
        for seed in (10, 11, 10)
    ]
    assert replies[0] == replies[2]
    assert replies[0] != replies[1]
    text_only = llamactx.chat(small_ctx, [("user", "Describe the image.")], max_tokens=12)
    assert text_only not in replies[:2]


def test_a_chat_image_is_the_one_eval_chunks_reads(
    mtmd: MtmdContext, model: llamactx.LlamaModel, small_ctx: llamactx.LlamaContext
) -> None:
    """The chat path and the low-level path read the same prompt: a chat message rendered by
    hand with the marker gives the same greedy reply."""
    image = picture(12)
    system = ("system", "You read images.")  # SmolLM2's template adds its own system turn otherwise
    reply = llamactx.chat(small_ctx, [system, image_message("What is it?", image)], max_tokens=8, mtmd=mtmd)
    rendered = model.apply_chat_template([system, ("user", "<__media__>What is it?")], None, True)
    chunks = mtmd.tokenize(rendered, [MtmdBitmap.from_rgb(image)], add_special=model.add_bos_token())
    small_ctx.clear_kv_cache()
    history = [0] * mtmd.eval_chunks(small_ctx, chunks, 0, 0)
    pieces = llamactx.continue_sequence(small_ctx, history, max_tokens=8, sampler=llamactx.LlamaSampler.greedy())
    assert "".join(pieces) == reply


def test_greedy_tokens_equal_llama_mtmd_cli_on_the_same_inputs(
    mtmd: MtmdContext, model: llamactx.LlamaModel, model_path: Path, projector_path: Path, tmp_path: Path
) -> None:
    cli = comparable_mtmd_cli()
    image = picture(12)
    (tmp_path / "image.png").write_bytes(png(image))
    ran = subprocess.run(
        [
            *(str(cli), "-m", str(model_path), "--mmproj", str(projector_path), "--image", str(tmp_path / "image.png")),
            *("-p", "What is it?", "-n", "16", "--temp", "0", "-t", str(threads()), "-c", "512"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    # The CLI renders the marker before the prompt with the template llama.cpp matches (no
    # system turn), as below.
    rendered = model.apply_chat_template([("user", "<__media__>What is it?")], None, True)
    with model.new_context(n_ctx=512, n_threads=threads(), n_threads_batch=threads()) as ctx:
        chunks = mtmd.tokenize(rendered, [MtmdBitmap.from_rgb(image)], add_special=model.add_bos_token())
        history = [0] * mtmd.eval_chunks(ctx, chunks, 0, 0)
        ours = "".join(llamactx.continue_sequence(ctx, history, max_tokens=16, sampler=llamactx.LlamaSampler.greedy()))
    assert len(ours) > 8
    assert ran.stdout.strip() == ours.strip()


def test_without_a_projector_images_are_refused(small_ctx: llamactx.LlamaContext, engine: llamactx.Engine) -> None:
    message = image_message("Describe it.", picture(13))
    with pytest.raises(ValueError, match="without a projector"):
        llamactx.chat(small_ctx, [message])
    with pytest.raises(ValueError, match="without a projector"):
        engine.submit_chat([message])


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("https://example.com/cat.png", "does not fetch 'https'"),
        ("http://127.0.0.1/cat.png", "does not fetch 'http'"),
        ("file:///etc/passwd", "does not fetch 'file'"),
        ("/etc/passwd", "does not fetch 'a path'"),
        ("data:image/png;base64,!!!!", "malformed"),
        ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "not a PNG"),
    ],
)
def test_image_urls_other_than_data_urls_are_refused(mtmd: MtmdContext, small_ctx: Any, url: str, error: str) -> None:
    message = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}
    with pytest.raises(ValueError, match=error):
        llamactx.chat(small_ctx, [message], mtmd=mtmd)


def test_a_message_cannot_place_an_image_with_a_marker(mtmd: MtmdContext, small_ctx: llamactx.LlamaContext) -> None:
    """Markers in a message's text stay text: the images are exactly the image parts."""
    forged = [image_message("<__media__> <media-00000000000000000000000000000000>", picture(14))]
    renderer = llamactx._render.ChatRenderer(small_ctx.model)
    prepared = renderer.prepare(forged, mtmd=mtmd)
    assert prepared.media is not None
    assert len(prepared.media.chunks) == 1


def test_a_session_encodes_an_image_once_for_the_whole_conversation(
    model: llamactx.LlamaModel, projector_path: Path, small_ctx: llamactx.LlamaContext
) -> None:
    with MtmdContext(model, projector_path) as mtmd:
        session = llamactx.ChatSession(small_ctx, max_tokens=8, mtmd=mtmd)
        first = "".join(session.send(image_message("Describe the image.", picture(15))["content"]))
        assert mtmd.n_encodes() == 1
        second = "".join(session.send("And its colours?"))
        third = "".join(session.send("Thanks."))
        assert mtmd.n_encodes() == 1
        # A fresh conversation decodes the image again from the embeddings the projector kept,
        # and answers the same.
        fresh = llamactx.ChatSession(small_ctx, max_tokens=8, mtmd=mtmd)
        assert "".join(fresh.send(image_message("Describe the image.", picture(15))["content"])) == first
        assert mtmd.n_encodes() == 1
        assert [second, third] == ["".join(fresh.send("And its colours?")), "".join(fresh.send("Thanks."))]


def url_part(data: bytes) -> dict[str, Any]:
    """An ``image_url`` part holding ``data`` (any bytes) as a PNG data URL."""
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


@pytest.mark.parametrize(
    ("limits", "error"),
    [
        ({"max_parts": 0}, "max_parts must be >= 1"),
        ({"max_pixels": 0}, "max_pixels must be in 1..=134217728"),
        ({"max_pixels": 2**27 + 1}, "max_pixels must be in 1..=134217728"),
        ({"max_audio_seconds": 0.0}, "max_audio_seconds must be"),
        ({"max_audio_seconds": float("nan")}, "max_audio_seconds must be"),
    ],
)
def test_a_media_budget_refuses_limits_out_of_range(limits: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        llamactx.MediaBudget(**limits)


def test_a_chat_s_media_parts_are_counted_before_any_is_decoded(
    mtmd: MtmdContext, small_ctx: llamactx.LlamaContext, image_engine: llamactx.Engine
) -> None:
    # Seventeen parts of no image: the count refuses them before the first is read.
    message = {"role": "user", "content": [url_part(b"not an image")] * 17}
    for prepare in (
        lambda budget: llamactx.chat(small_ctx, [message], mtmd=mtmd, media_budget=budget),
        lambda budget: image_engine.prepare_chat([message], media_budget=budget),
    ):
        with pytest.raises(ValueError, match=r"17 image and audio parts, more than the 16 .*--max-media-parts"):
            prepare(llamactx.MediaBudget())
        with pytest.raises(ImageError, match="not a PNG"):
            prepare(llamactx.MediaBudget(max_parts=17))


def test_a_chat_s_images_share_one_pixel_budget(
    mtmd: MtmdContext, small_ctx: llamactx.LlamaContext, image_engine: llamactx.Engine
) -> None:
    two = llamactx.MediaBudget(max_pixels=2 * 64 * 64)
    assert image_engine.prepare_chat([image_message("Compare them.", picture(70), picture(71))], media_budget=two)
    three = [image_message("Compare them.", picture(70), picture(71), picture(72))]
    refusal = r"content\[2\]: .* the images of a chat may hold 8192 pixels in all, 8192 of them taken by those before"
    with pytest.raises(ValueError, match=rf"{refusal} .*--max-media-pixels"):
        image_engine.submit_chat(three, media_budget=two)
    with pytest.raises(ValueError, match=refusal):
        llamactx.chat(small_ctx, three, mtmd=mtmd, media_budget=two)
    # A conversation's budget is its whole prompt's: a turn past it is refused, and changes nothing.
    session = llamactx.ChatSession(small_ctx, max_tokens=2, mtmd=mtmd, media_budget=two)
    "".join(session.send(image_message("Compare them.", picture(70), picture(71))["content"]))
    with pytest.raises(ValueError, match=r"messages\[2\]\.content\[0\]: .* 8192 of them taken"):
        "".join(session.send(image_message("And this?", picture(72))["content"]))
    assert len(session.messages) == 2


#: Prepares a chat of argv[4] copies of the image file argv[3] with the model argv[1] and the
#: projector argv[2], under an address-space limit of what the loaded process holds plus 1 GiB (an
#: allocation past it aborts the process, as one past the machine's memory would), and prints
#: ``REFUSED`` with the exception's name and message, or ``ACCEPTED``.
PREPARE_IN_A_CHILD = """
import base64, resource, sys
import llamactx
from llamactx._render import ChatRenderer
model = llamactx.LlamaModel.load_from_file(sys.argv[1])
mtmd = llamactx.MtmdContext(model, sys.argv[2], n_threads=1)
with open(sys.argv[3], "rb") as file:
    url = "data:image/png;base64," + base64.b64encode(file.read()).decode()
parts = [{"type": "image_url", "image_url": {"url": url}}] * int(sys.argv[4])
messages = [{"role": "user", "content": [*parts, {"type": "text", "text": "What are these?"}]}]
held = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (held + (1 << 30), held + (1 << 30)))
try:
    ChatRenderer(model).prepare(messages, mtmd=mtmd)
except ValueError as error:
    print("REFUSED", type(error).__name__, error)
else:
    print("ACCEPTED")
"""


def test_pixel_bombs_are_refused_from_their_headers_within_the_pixel_budget(
    model_path: Path, projector_path: Path, tmp_path: Path
) -> None:
    """Sixteen 32 KB PNGs of 8192 x 4096 pixels (96 MiB each, decoded): the first takes the whole
    default budget, and the second is refused from its header, within 1 GiB of memory."""
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png(np.zeros((4096, 8192, 1), np.uint8)))
    assert bomb.stat().st_size < 64 * 1024
    ran = subprocess.run(
        [sys.executable, "-c", PREPARE_IN_A_CHILD, str(model_path), str(projector_path), str(bomb), "16"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.startswith(
        "REFUSED ChatInputError messages[0].content[1]: the image is 8192x4096 = 33554432 pixels, more than the "
        "limit of 0: the images of a chat may hold 33554432 pixels in all, 33554432 of them taken by those before it"
    ), ran.stdout


#: Makes media bitmaps under an address-space limit of what the process holds plus 16 MiB, with
#: the model argv[1] and the projector argv[2] loaded, and prints each outcome; then, the limit
#: lifted, tokenizes an image.
BITMAPS_WITHOUT_MEMORY_IN_A_CHILD = """
import resource, sys
import numpy as np
import llamactx
model = llamactx.LlamaModel.load_from_file(sys.argv[1])
mtmd = llamactx.MtmdContext(model, sys.argv[2], n_threads=1)
pixels = np.ones((4096, 8192, 3), np.uint8)
samples = np.zeros(9_600_000, np.float32)
held = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize:")) * 1024
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (held + (16 << 20), hard))
cases = {
    "mtmd's copy of pixels": lambda: llamactx.MtmdBitmap.from_rgb(pixels),
    "our copy of strided pixels": lambda: llamactx.MtmdBitmap.from_rgb(pixels[:, ::-1]),
    "mtmd's copy of samples": lambda: llamactx.MtmdBitmap.from_audio(samples),
}
for case, make in cases.items():
    try:
        make()
        print(case, "MADE")
    except Exception as error:
        print(case, "REFUSED", type(error).__name__, error)
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
print("AFTER", mtmd.tokenize(mtmd.marker(), [llamactx.MtmdBitmap.from_rgb(pixels[:64, :64])]).n_tokens())
"""


def test_a_bitmap_without_memory_for_its_copy_is_an_error_not_an_abort(model_path: Path, projector_path: Path) -> None:
    """mtmd's bitmap constructors copy into a `std::vector` and do not catch `std::bad_alloc`
    (which would abort the process at the Rust boundary); a strided array is copied by Rust,
    which would abort too."""
    ran = subprocess.run(
        [sys.executable, "-c", BITMAPS_WITHOUT_MEMORY_IN_A_CHILD, str(model_path), str(projector_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    lines = ran.stdout.splitlines()
    failed = "(llama.cpp: {} threw a C++ exception: std::bad_alloc)"
    assert lines == [
        f"mtmd's copy of pixels REFUSED MtmdError failed to create mtmd bitmap {failed.format('mtmd_bitmap_init')}",
        "our copy of strided pixels REFUSED MemoryError no memory for a copy of 100663296 array elements",
        "mtmd's copy of samples REFUSED MtmdError failed to create mtmd bitmap "
        + failed.format("mtmd_bitmap_init_from_audio"),
        f"AFTER {PROJECTOR_TOKENS}",
    ], ran.stdout


@pytest.fixture(scope="module")
def image_engine(model: llamactx.LlamaModel, mtmd: MtmdContext) -> Any:
    with llamactx.Engine(
        model, mtmd=mtmd, n_ctx=2048, n_seq_max=4, n_threads=threads(), n_threads_batch=threads()
    ) as engine:
        yield engine


def test_the_engine_replies_to_an_image_as_chat_does(
    image_engine: llamactx.Engine, mtmd: MtmdContext, model: llamactx.LlamaModel
) -> None:
    messages = [image_message("Describe the image.", picture(20))]
    with model.new_context(n_ctx=512, n_threads=threads(), n_threads_batch=threads()) as ctx:
        expected = llamactx.chat(ctx, messages, max_tokens=12, mtmd=mtmd)
    assert image_engine.submit_chat(messages, max_tokens=12).result().text == expected


def test_the_engine_serves_image_chats_at_once_as_one_at_a_time(
    image_engine: llamactx.Engine, mtmd: MtmdContext, model: llamactx.LlamaModel
) -> None:
    conversations = [[image_message(f"Image {n}: what is in it?", picture(30 + n))] for n in range(6)]
    with model.new_context(n_ctx=512, n_threads=threads(), n_threads_batch=threads()) as ctx:
        one_at_a_time = [llamactx.chat(ctx, messages, max_tokens=10, mtmd=mtmd) for messages in conversations]
    requests = [image_engine.submit_chat(messages, max_tokens=10) for messages in conversations]
    assert [request.result().text for request in requests] == one_at_a_time
    assert len(set(one_at_a_time)) > 1


def test_a_conversation_about_an_image_reads_it_once(model: llamactx.LlamaModel, projector_path: Path) -> None:
    with (
        MtmdContext(model, projector_path, n_threads=threads()) as projector,
        llamactx.Engine(model, mtmd=projector, n_ctx=1024, n_seq_max=2, n_threads=threads()) as engine,
    ):
        first_turn = [image_message("Describe the image.", picture(40))]
        reply = engine.submit_chat(first_turn, max_tokens=8).result().text
        computed = engine.stats().prompt_tokens_computed
        second_turn = [*first_turn, {"role": "assistant", "content": reply}, {"role": "user", "content": "More?"}]
        engine.submit_chat(second_turn, max_tokens=8).result()
        first_length = len(engine.prepare_chat(first_turn).tokens) + PROJECTOR_TOKENS
        second_length = len(engine.prepare_chat(second_turn).tokens) + PROJECTOR_TOKENS
        stats = engine.stats()
        assert stats.prefix_cache_hits == 1
        # Only what follows the first turn's prompt (image included) was read: the reply's 8
        # tokens at most, and the new turn.
        assert stats.prompt_tokens_computed - computed <= second_length - first_length + 8
        assert projector.n_encodes() == 1
        # Another image in the same place is no cache hit for its positions: it is encoded.
        engine.submit_chat([image_message("Describe the image.", picture(41))], max_tokens=4).result()
        assert projector.n_encodes() == 2


def test_a_prepared_chat_counts_its_images_tokens(image_engine: llamactx.Engine) -> None:
    """``n_tokens`` is the prompt's whole length, as the engine reads it: 16 tokens an image here."""
    counts = []
    for images in (0, 1, 4):
        chat = image_engine.prepare_chat([image_message("What is in these?", *map(picture, range(images)))])
        assert chat.n_tokens == len(chat.tokens) + images * PROJECTOR_TOKENS
        assert image_engine.submit_prepared(chat, max_tokens=1).result().prompt_tokens == chat.n_tokens
        counts.append(chat.n_tokens)
    assert counts[1] - counts[0] == PROJECTOR_TOKENS


def test_an_image_prompt_too_long_is_refused_before_its_images_are_encoded(
    model: llamactx.LlamaModel, projector_path: Path, small_ctx: llamactx.LlamaContext
) -> None:
    with (
        MtmdContext(model, projector_path, n_threads=threads()) as projector,
        llamactx.Engine(model, mtmd=projector, n_ctx=512, n_seq_max=2, n_threads=threads()) as engine,
    ):
        # Text that fits a sequence, and four images past it.
        text = "a " * (engine.n_ctx_seq - 60)
        assert len(engine.chat_tokens([("user", text)])) < engine.n_ctx_seq
        messages = [image_message(text, *map(picture, range(4)))]
        whole = engine.prepare_chat(messages).n_tokens
        assert whole >= engine.n_ctx_seq
        with pytest.raises(ValueError, match=f"the prompt has {whole} tokens, its images' included; a sequence holds"):
            engine.submit_chat(messages)
        # The same check, and message, on a context.
        long = [image_message("a " * (small_ctx.n_ctx_seq() - 60), *map(picture, range(4)))]
        too_long = rf"the prompt has \d+ tokens, its images' included; a sequence holds {small_ctx.n_ctx_seq()} "
        with pytest.raises(ValueError, match=too_long):
            llamactx.chat(small_ctx, long, mtmd=projector)
        with pytest.raises(ValueError, match=too_long):
            "".join(llamactx.ChatSession(small_ctx, mtmd=projector).send(long[0]["content"]))
        assert projector.n_encodes() == 0


def test_an_engine_refuses_images_it_cannot_read(
    model: llamactx.LlamaModel, mtmd: MtmdContext, draft_model: llamactx.LlamaModel, projector_path: Path
) -> None:
    message = [image_message("Describe it.", picture(42))]
    drafting = llamactx.NgramDraft(only_where_faster=False)
    with llamactx.Engine(model, mtmd=mtmd, speculative=drafting, n_ctx=512, n_seq_max=1) as engine:
        with pytest.raises(ValueError, match="speculative decoding does not take"):
            engine.submit_chat(message)
        assert engine.submit_chat([("user", "Hi")], max_tokens=2).result().text
    with pytest.raises(ValueError, match="another model"):
        llamactx.Engine(draft_model, mtmd=mtmd, n_ctx=512, n_seq_max=1)


def test_the_server_replies_to_an_image_as_chat_and_the_engine_do(
    model_path: Path, model: llamactx.LlamaModel, mtmd: MtmdContext, projector_path: Path
) -> None:
    messages = [image_message("What is in this image?", picture(50))]
    with model.new_context(n_ctx=512, n_threads=threads(), n_threads_batch=threads()) as ctx:
        expected = llamactx.chat(ctx, messages, max_tokens=12, mtmd=mtmd)
    with llamactx.Engine(model, mtmd=mtmd, **ENGINE_OPTIONS) as engine:
        assert engine.submit_chat(messages, max_tokens=12).result().text == expected
    with (
        running_server(model_path, "--no-prefix-cache", "--mmproj", str(projector_path)) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused") as client,
    ):
        reply = client.chat.completions.create(
            model=MODEL_ID,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=12,
            temperature=0,
        )
        assert reply.choices[0].message.content == expected
        fetched = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}]}]
        with pytest.raises(openai.BadRequestError, match="does not fetch"):
            client.chat.completions.create(model=MODEL_ID, messages=fetched, max_tokens=2)  # type: ignore[arg-type]
        broken = [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
        ]
        with pytest.raises(openai.BadRequestError, match="not a PNG"):
            client.chat.completions.create(model=MODEL_ID, messages=broken, max_tokens=2)  # type: ignore[arg-type]
        assert server.metrics()["llamactx_engine_running"] == 0


@pytest.fixture(scope="module")
def image_server(model_path: Path, projector_path: Path) -> Iterator[Server]:
    """A server that reads images, with small sequences, without the prefix cache."""
    options = ("--no-prefix-cache", "--mmproj", str(projector_path), "--ctx", "512", "--parallel", "4")
    with running_server(model_path, *options) as server:
        yield server


def posted(server: Server, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{route}", json={"model": MODEL_ID, **body}, timeout=120)


def anthropic_message(text: str, *images: np.ndarray) -> dict[str, Any]:
    """``image_message`` in Anthropic's blocks."""
    blocks: list[dict[str, Any]] = [
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png(image)).decode()},
        }
        for image in images
    ]
    return {"role": "user", "content": [*blocks, {"type": "text", "text": text}]}


def responses_message(text: str, *images: np.ndarray) -> dict[str, Any]:
    """``image_message`` in the Responses API's parts."""
    parts: list[dict[str, Any]] = [{"type": "input_image", "image_url": data_url(image)} for image in images]
    return {"role": "user", "content": [*parts, {"type": "input_text", "text": text}]}


def test_the_server_counts_every_image_s_tokens(image_server: Server) -> None:
    """Counted, started and used alike: the prompt with its images, as the engine reads it."""
    counted = []
    for images in (0, 1, 4):
        messages = [anthropic_message("What is in these?", *map(picture, range(images)))]
        count = posted(image_server, "/v1/messages/count_tokens", {"messages": messages}).json()["input_tokens"]
        body = {"messages": messages, "max_tokens": 1}
        assert posted(image_server, "/v1/messages", body).json()["usage"]["input_tokens"] == count
        stream = posted(image_server, "/v1/messages", {**body, "stream": True}).text
        start = json.loads(stream.split("\n\n")[0].split("\ndata: ")[1])
        assert start["type"] == "message_start"
        assert start["message"]["usage"]["input_tokens"] == count
        counted.append(count)
    assert [count - counted[0] for count in counted] == [0, PROJECTOR_TOKENS, 4 * PROJECTOR_TOKENS]


def test_an_image_prompt_too_long_is_refused_as_a_text_one_is(image_server: Server) -> None:
    """``context_length_exceeded`` with the whole prompt's tokens on all three APIs, before any
    image is encoded, whatever constrains the reply (no ``response_format``, ``text.format`` or
    ``tools`` is blamed)."""
    too_long = posted(image_server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "a " * 600}]})
    n_ctx = too_long.json()["error"]["n_ctx"]
    text = "a " * (n_ctx - 60)
    fits = posted(image_server, "/v1/messages/count_tokens", {"messages": [anthropic_message(text)]})
    assert fits.json()["input_tokens"] < n_ctx
    images = [picture(seed) for seed in range(4)]
    counted = posted(image_server, "/v1/messages/count_tokens", {"messages": [anthropic_message(text, *images)]})
    whole = counted.json()["input_tokens"]
    assert whole >= n_ctx
    expected = f"the prompt has {whole} tokens; a request of this server holds at most {n_ctx} (prompt and completion)"
    chat = {"messages": [image_message(text, *images)], "response_format": {"type": "json_object"}}
    responses = {"input": [responses_message(text, *images)], "text": {"format": {"type": "json_object"}}}
    for route, body in (("/v1/chat/completions", chat), ("/v1/responses", responses)):
        refused = posted(image_server, route, body)
        assert refused.status_code == 400
        assert refused.json()["error"] == {
            **too_long.json()["error"],
            "message": expected,
            "n_prompt_tokens": whole,
        }
    # With a tool, which its system prompt describes: counted too.
    tools = {"messages": [anthropic_message(text, *images)], "tools": [{"name": "look", "input_schema": {}}]}
    with_tools = posted(image_server, "/v1/messages/count_tokens", tools).json()["input_tokens"]
    assert with_tools > whole
    refused = posted(image_server, "/v1/messages", {**tools, "max_tokens": 4})
    assert refused.status_code == 400
    assert refused.json()["error"] == {
        "type": "invalid_request_error",
        "message": expected.replace(f"has {whole} tokens", f"has {with_tools} tokens"),
    }
    image_server.wait_until_idle()


def test_the_server_answers_health_while_a_request_s_images_are_decoded(model_path: Path, projector_path: Path) -> None:
    """Eight images of 4096 x 4096 pixels (PNGs of 50 KB each, 2**27 pixels together, the most
    `--max-media-pixels` allows): decoding, tokenizing and encoding them takes the server's CPU
    for seconds, all off the event loop."""
    blank = url_part(png(np.zeros((4096, 4096, 3), np.uint8)))
    body = {"messages": [{"role": "user", "content": [blank] * 8}], "max_tokens": 1}
    with running_server(model_path, "--mmproj", str(projector_path), "--max-media-pixels", str(2**27)) as server:
        started = time.perf_counter()
        response, slowest = while_polling_health(server, lambda: posted(server, "/v1/chat/completions", body))
        took = time.perf_counter() - started
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] > 8 * PROJECTOR_TOKENS
    assert took > HEALTH_SECONDS
    assert slowest < HEALTH_SECONDS


def test_the_server_reads_a_request_s_media_under_its_budget(
    image_server: Server, model_path: Path, projector_path: Path
) -> None:
    parts = [url_part(png(picture(80)))] * 17
    refused = posted(image_server, "/v1/chat/completions", {"messages": [{"role": "user", "content": parts}]})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "messages"
    assert "17 image and audio parts, more than the 16 one chat may hold" in error["message"]
    assert "--max-media-parts" in error["message"]
    help_text = subprocess.run(
        [sys.executable, "-m", "llamactx", "serve", "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    for option in ("--max-media-parts N", "--max-media-pixels PIXELS", "--max-audio-seconds SECONDS"):
        assert option in help_text
    budget = ("--max-media-parts", "2", "--max-media-pixels", "5000")
    with running_server(model_path, "--mmproj", str(projector_path), *budget) as server:
        three = posted(server, "/v1/chat/completions", {"messages": [image_message("Hi", *map(picture, range(3)))]})
        assert three.status_code == 400
        assert "3 image and audio parts, more than the 2 " in three.json()["error"]["message"]
        two = posted(
            server, "/v1/messages", {"messages": [anthropic_message("Hi", picture(1), picture(2))], "max_tokens": 1}
        )
        assert two.status_code == 400
        message = two.json()["error"]["message"]
        assert "may hold 5000 pixels in all, 4096 of them taken by those before it" in message
        assert "--max-media-pixels" in message
        one = posted(server, "/v1/chat/completions", {"messages": [image_message("Hi", picture(1))], "max_tokens": 1})
        assert one.status_code == 200


def test_a_server_without_a_projector_answers_images_with_400(model_path: Path) -> None:
    with (
        running_server(model_path) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused") as client,
        pytest.raises(openai.BadRequestError, match="without a projector"),
    ):
        client.chat.completions.create(
            model=MODEL_ID,
            messages=[image_message("What is it?", picture(51))],  # type: ignore[list-item]
            max_tokens=2,
        )


def test_serve_refuses_a_file_that_is_no_projector(model_path: Path) -> None:
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "llamactx",
            "serve",
            "--model",
            str(model_path),
            "--port",
            "0",
            "--mmproj",
            str(model_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 2
    assert "llamactx serve: the file is no projector" in ran.stderr


def test_the_cli_chats_about_an_image_file(model_path: Path, projector_path: Path, tmp_path: Path) -> None:
    image = tmp_path / "picture.png"
    image.write_bytes(png(picture(60)))
    command = [sys.executable, "-m", "llamactx", "chat", "--model", str(model_path), "-n", "6", "--greedy"]
    shown = subprocess.run(
        [*command, "--mmproj", str(projector_path), "--image", str(image), "Describe it."],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    other = image.with_name("other.png")
    other.write_bytes(png(picture(61)))
    second = subprocess.run(
        [*command, "--mmproj", str(projector_path), "--image", str(other), "Describe it."],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert shown.stdout.strip()
    assert shown.stdout != second.stdout
    for bad, message in (([], "--image needs --mmproj"), (["--mmproj", str(projector_path)], "not a PNG")):
        (tmp_path / "fake.png").write_text("no image")
        refused = subprocess.run(
            [*command, *bad, "--image", str(tmp_path / "fake.png"), "hi"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert refused.returncode == 2
        assert message in refused.stderr
