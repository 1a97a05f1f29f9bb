"""Image URLs a server fetches only where allowed (``MediaUrlPolicy``, ``serve --allow-media-urls``):
never from an address that is not public, within a byte budget and a deadline, TLS verified.

The fetching is tested against a file server of these tests on loopback, which a policy reaches
only through ``allowed_networks``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import anthropic
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from serving import MODEL_ID, running_server
from support.images import data_url, image_message, picture, png

import llamactx
from llamactx.server import MediaUrlPolicy, create_app
from llamactx.server._media_urls import MediaUrls
from llamactx.server._protocol import ApiError

IMAGE = png(picture(60))
LOOPBACK = ("127.0.0.1/32",)


class FileServer:
    """An HTTP(S) server on loopback whose paths answer as ``ROUTES`` say; it counts requests."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[str] = []
        files = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                files.requests.append(self.path)
                ROUTES.get(self.path, _missing)(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        if tls is not None:
            self.http.socket = tls.wrap_socket(self.http.socket, server_side=True)
        self.port = self.http.server_address[1]
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str, host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def _answer(handler: BaseHTTPRequestHandler, body: bytes, kind: str = "image/png", length: bool = True) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", kind)
    if length:
        handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _missing(handler: BaseHTTPRequestHandler) -> None:
    handler.send_error(404)


def _redirect(location: str) -> Callable[[BaseHTTPRequestHandler], None]:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(302)
        port = cast(ThreadingHTTPServer, handler.server).server_port
        handler.send_header("Location", location.replace("PORT", str(port)))
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def _unsized(handler: BaseHTTPRequestHandler) -> None:
    """2000 bytes without a Content-Length: read until the connection closes."""
    handler.close_connection = True
    _answer(handler, b"x" * 2000, length=False)


def _slow(handler: BaseHTTPRequestHandler) -> None:
    time.sleep(3)
    with contextlib.suppress(OSError):  # the fetcher has hung up
        _answer(handler, IMAGE)


def _dripping(handler: BaseHTTPRequestHandler) -> None:
    """Headers at once, then a byte every 0.1 s: each read is quick, the whole never ends."""
    handler.send_response(200)
    handler.send_header("Content-Length", "1000")
    handler.end_headers()
    with contextlib.suppress(OSError):  # the fetcher hangs up
        for _ in range(30):
            handler.wfile.write(b"x")
            handler.wfile.flush()
            time.sleep(0.1)


ROUTES: dict[str, Callable[[BaseHTTPRequestHandler], None]] = {
    "/image.png": lambda handler: _answer(handler, IMAGE),
    "/untyped": lambda handler: _answer(handler, IMAGE, kind="application/octet-stream"),
    "/big": lambda handler: _answer(handler, b"x" * 2000),
    "/unsized": _unsized,
    "/slow": _slow,
    "/dripping": _dripping,
    "/hop": _redirect("/image.png"),
    "/to-private": _redirect("http://10.0.0.1/image.png"),
    "/to-other-loopback": _redirect("http://127.0.0.2:PORT/image.png"),
    "/loop": _redirect("/loop"),
    "/to-file": _redirect("file:///etc/passwd"),
    "/to-ftp": _redirect("ftp://127.0.0.1:PORT/image.png"),
}


@pytest.fixture(scope="module")
def files() -> Iterator[FileServer]:
    server = FileServer()
    yield server
    server.close()


def url_message(*urls: str) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": url, "detail": "auto"}} for url in urls]
    return {"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]}


def inlined(policy: MediaUrlPolicy, *urls: str) -> list[dict[str, Any]]:
    """The image parts of a message of ``urls``, after the policy's fetcher inlined them."""
    message = url_message(*urls)
    asyncio.run(MediaUrls(policy).inline([message]))
    return [part for part in message["content"] if part["type"] == "image_url"]


def refusal(policy: MediaUrlPolicy, *urls: str) -> ApiError:
    with pytest.raises(ApiError) as refused:
        inlined(policy, *urls)
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, "messages", "media_url_refused")
    return refused.value


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "localhost",
        "[::1]",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "169.254.169.254",  # cloud metadata services
        "100.64.0.1",  # shared (carrier-grade NAT)
        "0.0.0.0",
        "[::ffff:127.0.0.1]",  # IPv4 inside IPv6
        "[::ffff:a00:1]",
        "[fd00::1]",
        "[fe80::1]",
        "224.0.0.1",
        "2130706433",  # 127.0.0.1 as one number
        "0x7f.1",
    ],
)
def test_addresses_that_are_not_public_are_never_fetched(files: FileServer, host: str) -> None:
    before = len(files.requests)
    error = refusal(MediaUrlPolicy(), files.url("/image.png", host))
    assert "not a public address" in error.message
    assert len(files.requests) == before


def test_a_network_the_operator_allows_is_fetched_into_a_data_url(files: FileServer) -> None:
    policy = MediaUrlPolicy(allowed_networks=LOOPBACK)
    [part] = inlined(policy, files.url("/image.png"))
    assert part["image_url"] == {"url": f"data:image/png;base64,{base64.b64encode(IMAGE).decode()}", "detail": "auto"}
    # A body of another type keeps its bytes (the decoder identifies images by their signature).
    [untyped] = inlined(policy, files.url("/untyped"))
    assert untyped["image_url"]["url"] == f"data:image/unknown;base64,{base64.b64encode(IMAGE).decode()}"
    # Data URLs pass through untouched.
    [kept] = inlined(policy, data_url(picture(61)))
    assert kept["image_url"]["url"] == data_url(picture(61))
    assert "not a public address" in refusal(MediaUrlPolicy(allowed_networks=("10.0.0.0/8",)), files.url("/x")).message


def test_redirects_are_followed_and_checked_like_the_first_url(files: FileServer) -> None:
    policy = MediaUrlPolicy(allowed_networks=LOOPBACK)
    [part] = inlined(policy, files.url("/hop"))
    assert part["image_url"]["url"].endswith(base64.b64encode(IMAGE).decode())
    assert "10.0.0.1, which is not a public address" in refusal(policy, files.url("/to-private")).message
    assert "127.0.0.2, which is not a public address" in refusal(policy, files.url("/to-other-loopback")).message
    assert "more than 3 redirects" in refusal(policy, files.url("/loop")).message
    assert "not 'file' ones" in refusal(policy, files.url("/to-file")).message
    assert "not 'ftp' ones" in refusal(policy, files.url("/to-ftp")).message
    assert "answered HTTP 404" in refusal(policy, files.url("/nothing-here")).message


def test_a_request_s_urls_share_one_byte_budget(files: FileServer) -> None:
    small = MediaUrlPolicy(max_bytes=1000, allowed_networks=LOOPBACK)
    assert "more than the 1000 bytes" in refusal(small, files.url("/big")).message
    assert "more than the 1000 bytes" in refusal(small, files.url("/unsized")).message
    two = MediaUrlPolicy(max_bytes=len(IMAGE) * 2 - 1, allowed_networks=LOOPBACK)
    assert len(inlined(two, files.url("/image.png"))) == 1
    assert f"more than the {len(IMAGE) - 1} bytes" in refusal(two, *[files.url("/image.png")] * 2).message


@pytest.mark.parametrize("path", ["/slow", "/dripping"])
def test_a_request_s_urls_share_one_deadline(files: FileServer, path: str) -> None:
    started = time.monotonic()
    error = refusal(MediaUrlPolicy(timeout=0.5, allowed_networks=LOOPBACK), files.url(path))
    assert "not fetched within 0.5 s" in error.message
    assert time.monotonic() - started < 2


def test_urls_that_are_not_fetched_at_all() -> None:
    policy = MediaUrlPolicy(allowed_networks=LOOPBACK)
    assert "credentials" in refusal(policy, "http://user:secret@127.0.0.1/image.png").message
    assert "does not resolve" in refusal(policy, "http://no-such-host.invalid/image.png").message
    assert "no host" in refusal(policy, "http:///image.png").message


def test_policies_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        MediaUrlPolicy(max_bytes=0)
    with pytest.raises(ValueError, match="timeout"):
        MediaUrlPolicy(timeout=0)
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        MediaUrlPolicy(allowed_networks=("ten dot zero",))


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FileServer, Path]]:
    """An HTTPS file server on 127.0.0.1 and the file of its certificate: self-signed, for the
    name ``localhost`` only (not for the address)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    (folder / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    server = FileServer(context)
    yield server, folder / "cert.pem"
    server.close()


def test_https_hosts_are_verified_against_the_url_s_host_name(tls_files: tuple[FileServer, Path]) -> None:
    files, certificate = tls_files
    loopback = ("127.0.0.0/8", "::1/128")
    # The system's authorities do not know this certificate.
    untrusted = refusal(MediaUrlPolicy(allowed_networks=loopback), files.url("/image.png", "localhost", "https"))
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.message
    trusting = MediaUrlPolicy(allowed_networks=loopback, ssl_context=ssl.create_default_context(cafile=certificate))
    [part] = inlined(trusting, files.url("/image.png", "localhost", "https"))
    assert part["image_url"]["url"].endswith(base64.b64encode(IMAGE).decode())
    # Both connect to 127.0.0.1; the certificate is checked against the URL's own host name.
    mismatch = refusal(trusting, files.url("/image.png", "127.0.0.1", "https"))
    assert "IP address mismatch" in mismatch.message


def test_the_server_reads_an_image_alike_by_data_or_url_on_each_api(
    files: FileServer, model_path: Path, projector_path: Path
) -> None:
    image, question = picture(60), "What is it?"
    url = files.url("/image.png")
    with (
        running_server(
            model_path,
            "--no-prefix-cache",
            *("--mmproj", str(projector_path)),
            *("--allow-media-urls", "--media-url-allow-network", "127.0.0.1/32"),
        ) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused") as client,
        anthropic.Anthropic(base_url=server.url, api_key="unused") as claude,
    ):

        def chat(message: dict[str, Any]) -> str | None:
            completion = client.chat.completions.create(
                model=MODEL_ID,
                messages=[message],  # type: ignore[list-item]
                max_tokens=12,
                temperature=0,
            )
            return completion.choices[0].message.content

        def claude_reply(source: dict[str, str]) -> str:
            content: Any = [{"type": "image", "source": source}, {"type": "text", "text": question}]
            message = claude.messages.create(
                model=MODEL_ID,
                max_tokens=12,
                messages=[{"role": "user", "content": content}],
                extra_body={"temperature": 0},
            )
            return "".join(block.text for block in message.content if block.type == "text")

        def response_text(image_url: str) -> str:
            content: Any = [{"type": "input_image", "image_url": image_url}, {"type": "input_text", "text": question}]
            response = client.responses.create(
                model=MODEL_ID, max_output_tokens=12, temperature=0, input=[{"role": "user", "content": content}]
            )
            return response.output_text

        expected = chat(image_message(question, image))
        assert expected
        assert chat(url_message(url)) == expected
        encoded = base64.b64encode(IMAGE).decode()
        assert claude_reply({"type": "base64", "media_type": "image/png", "data": encoded}) == expected
        assert claude_reply({"type": "url", "url": url}) == expected
        assert response_text(data_url(image)) == expected
        assert response_text(url) == expected
        with pytest.raises(openai.BadRequestError, match="not a public address") as refused:
            chat(url_message("http://169.254.169.254/latest/meta-data/"))
        assert refused.value.code == "media_url_refused"
        with pytest.raises(anthropic.BadRequestError, match="not a public address"):
            claude_reply({"type": "url", "url": "http://10.1.2.3/x.png"})
        with pytest.raises(openai.BadRequestError, match="not a public address") as refused:
            response_text("http://[::1]/x.png")
        assert refused.value.param == "input"


def test_fetching_image_urls_needs_a_projector(model_path: Path, model: llamactx.LlamaModel) -> None:
    command = [sys.executable, "-m", "llamactx", "serve", "--model", str(model_path), "--port", "0"]
    ran = subprocess.run([*command, "--allow-media-urls"], capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 2
    assert ran.stderr == "llamactx serve: --allow-media-urls needs --mmproj, the projector that reads images\n"
    with llamactx.Engine(model, n_ctx=256, n_seq_max=1) as engine, pytest.raises(ValueError, match="needs a projector"):
        create_app(engine, media_urls=MediaUrlPolicy())
