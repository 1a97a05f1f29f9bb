"""Image URLs a server fetches only where allowed (``MediaUrlPolicy``, ``serve --allow-media-urls``):
never from an address that is not public, within a byte budget and a deadline, TLS verified.

The fetching is tested against a file server of these tests on loopback, which a policy reaches
only through ``allowed_networks``; host names other than ``localhost`` resolve through a stand-in
for the system's resolver (``resolver``), and addresses off loopback are judged without a
connection (``MediaUrls.refusal``, or ``no_connections``)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ipaddress
import socket
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
from support.images import data_url, image_message, picture, png
from support.serving import MODEL_ID, running_server

import llamactx
from llamactx.server import MediaUrlPolicy, _media_urls, create_app
from llamactx.server._errors import ApiError
from llamactx.server._media_urls import MediaUrls

IMAGE = png(picture(60))
LOOPBACK = ("127.0.0.1/32",)
PUBLIC = ipaddress.IPv4Address("8.8.8.8")
#: Each IPv6 form that a translator or tunnel carries to an IPv4 host, by what it makes of the
#: IPv4 address's 32 bits: Teredo's server sits in bits 32-63, its client in the last 32, inverted.
CARRIERS: dict[str, Callable[[int], int]] = {
    "mapped": lambda ipv4: (0xFFFF << 32) | ipv4,
    "compatible": lambda ipv4: ipv4,
    "siit": lambda ipv4: (0xFFFF << 48) | ipv4,
    "nat64": lambda ipv4: (0x64_FF9B << 96) | ipv4,
    "nat64-local-use": lambda ipv4: (0x64_FF9B_0001 << 80) | ipv4,
    "6to4": lambda ipv4: (0x2002 << 112) | (ipv4 << 80) | 1,
    "teredo-server": lambda ipv4: (0x2001_0000 << 96) | (ipv4 << 64) | (~int(PUBLIC) & 0xFFFF_FFFF),
    "teredo-client": lambda ipv4: (0x2001_0000 << 96) | (int(PUBLIC) << 64) | (~ipv4 & 0xFFFF_FFFF),
    "site-local": lambda ipv4: (0xFEC0 << 112) | ipv4,
}
#: The ranges of ``CARRIERS`` an operator may allow (a mapped address is its IPv4 address).
CARRIER_RANGES = {
    "compatible": "::/96",
    "siit": "::ffff:0:0:0/96",
    "nat64": "64:ff9b::/96",
    "nat64-local-use": "64:ff9b:1::/48",
    "6to4": "2002::/16",
    "teredo-server": "2001::/32",
    "teredo-client": "2001::/32",
    "site-local": "fec0::/10",
}


def carrying(form: str, ipv4: ipaddress.IPv4Address) -> ipaddress.IPv6Address:
    """The IPv6 address of ``form`` (``CARRIERS``) that reaches ``ipv4``."""
    return ipaddress.IPv6Address(CARRIERS[form](int(ipv4)))


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


class Resolver:
    """Stands in for the system's resolver (``socket.getaddrinfo``), so that no test asks a DNS
    server: a name of ``answers`` resolves to its address after ``delay`` seconds, any other name
    to nothing; an address (as connections resolve theirs) to itself, by the system's resolver."""

    def __init__(self) -> None:
        self.system = socket.getaddrinfo
        self.answers: dict[str, str] = {}
        self.delay = 0.0

    def __call__(self, host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        if host in self.answers:
            time.sleep(self.delay)
            address = self.answers[host]
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None
        return self.system(host, port, *args, **kwargs)


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Resolver:
    stub = Resolver()
    monkeypatch.setattr(socket, "getaddrinfo", stub)
    return stub


@pytest.fixture
def no_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails a fetch that connects at all (the fetcher connects with ``socket.create_connection``):
    for URLs of addresses that are not loopback, which a fetch must refuse before connecting."""

    def connect(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        raise AssertionError(f"the fetcher connected to {address}")

    monkeypatch.setattr(socket, "create_connection", connect)


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


@pytest.mark.parametrize("ipv4", ["127.0.0.1", "10.0.0.1", "169.254.169.254"])
@pytest.mark.parametrize("form", CARRIERS)
def test_ipv6_addresses_that_reach_an_ipv4_host_are_judged_by_it(form: str, ipv4: str) -> None:
    address = carrying(form, ipaddress.IPv4Address(ipv4))
    why = MediaUrls(MediaUrlPolicy()).refusal(address)
    assert why is not None
    assert "not a public address" in why
    # Allowing every IPv6 address still leaves the IPv4 one to be judged (where it is known).
    everywhere = MediaUrls(MediaUrlPolicy(allowed_networks=("::/0",))).refusal(address)
    if form in ("nat64-local-use", "site-local"):
        assert everywhere is None  # the operator named them; where their IPv4 host sits is the site's choice
    else:
        assert everywhere is not None
        assert ipv4 in everywhere


@pytest.mark.parametrize("form", CARRIERS)
def test_urls_and_host_names_of_ipv6_addresses_reaching_an_ipv4_host_are_refused_unconnected(
    resolver: Resolver, no_connections: None, form: str
) -> None:
    address = carrying(form, ipaddress.IPv4Address("169.254.169.254"))
    resolver.answers["carrier.test"] = str(address)
    assert "not a public address" in refusal(MediaUrlPolicy(), f"http://[{address}]/latest/meta-data/").message
    assert "not a public address" in refusal(MediaUrlPolicy(), "http://carrier.test/latest/meta-data/").message


@pytest.mark.parametrize("form", [form for form in CARRIER_RANGES if form not in ("nat64-local-use", "site-local")])
def test_a_public_ipv4_host_behind_a_translator_is_fetched_only_where_its_range_is_allowed(form: str) -> None:
    """A translator or tunnel is not the internet's own: it may be the site's, and it answers
    for whatever it forwards to. The operator who names its range vouches for it; the IPv4 host
    behind it is judged all the same."""
    public = carrying(form, PUBLIC)
    assert "not a public address" in (MediaUrls(MediaUrlPolicy()).refusal(public) or "")
    allowed = MediaUrls(MediaUrlPolicy(allowed_networks=(CARRIER_RANGES[form],)))
    assert allowed.refusal(public) is None
    private = carrying(form, ipaddress.IPv4Address("10.0.0.1"))
    assert "(it carries 10.0.0.1)" in (allowed.refusal(private) or "")
    both = MediaUrls(MediaUrlPolicy(allowed_networks=(CARRIER_RANGES[form], "10.0.0.0/8")))
    assert both.refusal(private) is None


def test_a_mapped_address_is_its_ipv4_address() -> None:
    """Sockets connect to the IPv4 address itself: no translator in between to vouch for."""
    assert MediaUrls(MediaUrlPolicy()).refusal(carrying("mapped", PUBLIC)) is None
    local = MediaUrls(MediaUrlPolicy(allowed_networks=("10.0.0.0/8",)))
    assert local.refusal(carrying("mapped", ipaddress.IPv4Address("10.0.0.1"))) is None


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


def test_a_host_name_s_resolution_counts_toward_the_deadline(resolver: Resolver, no_connections: None) -> None:
    resolver.answers["slow-dns.test"] = "127.0.0.1"
    resolver.delay = 3
    started = time.monotonic()
    error = refusal(MediaUrlPolicy(timeout=0.5, allowed_networks=LOOPBACK), "http://slow-dns.test/image.png")
    assert "not fetched within 0.5 s" in error.message
    assert time.monotonic() - started < 0.8  # the deadline's, not the event loop's later give-up


def test_a_host_name_resolved_in_time_is_fetched(files: FileServer, resolver: Resolver) -> None:
    resolver.answers["images.test"] = "127.0.0.1"
    resolver.delay = 0.1
    [part] = inlined(MediaUrlPolicy(allowed_networks=LOOPBACK), files.url("/image.png", "images.test"))
    assert part["image_url"]["url"].endswith(base64.b64encode(IMAGE).decode())


def test_slow_hosts_of_some_requests_do_not_hold_up_the_fetches_of_others(files: FileServer) -> None:
    fetcher = MediaUrls(MediaUrlPolicy(timeout=1.5, allowed_networks=LOOPBACK))
    stalled = [url_message(files.url("/slow")) for _ in range(8)]
    prompt = url_message(files.url("/image.png"))

    async def serve_all() -> tuple[list[bool], list[BaseException | None]]:
        stalling = [asyncio.ensure_future(fetcher.inline([message])) for message in stalled]
        await asyncio.sleep(0.2)  # each is waiting for its host's answer
        await fetcher.inline([prompt])
        waiting = [not fetch.done() for fetch in stalling]
        return waiting, await asyncio.gather(*stalling, return_exceptions=True)

    waiting, outcomes = asyncio.run(serve_all())
    assert prompt["content"][0]["image_url"]["url"].endswith(base64.b64encode(IMAGE).decode())
    assert all(waiting)  # the prompt's image came while the stalled requests still waited
    assert all(isinstance(outcome, ApiError) and "not fetched within" in outcome.message for outcome in outcomes)


def test_urls_that_are_not_fetched_at_all(resolver: Resolver) -> None:
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


def test_fetch_threads_past_their_bound_are_a_503_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each fetch and resolution has a thread of its own: their number is bounded for all
    requests together, and a request past the bound is answered at once, never queued."""
    bound = threading.BoundedSemaphore(1)
    monkeypatch.setattr(_media_urls, "_FETCH_THREADS", bound)
    release = threading.Event()
    held = _media_urls._on_a_thread_of_its_own(lambda: release.wait(10))
    with pytest.raises(ApiError) as refused:
        _media_urls._on_a_thread_of_its_own(lambda: True)
    assert refused.value.status == 503
    release.set()
    assert held.result(10) is True
    assert _media_urls._on_a_thread_of_its_own(lambda: "fetched").result(10) == "fetched"
