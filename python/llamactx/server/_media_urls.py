"""Image URLs a server fetches, where its operator allowed it (``MediaUrlPolicy``).

llamactx itself reads only ``data:`` URLs (``llamactx._media.bitmap_of_url``). A server made with
a policy fetches a chat's ``http(s)://`` image URLs before the chat is rendered and hands them on
as ``data:`` URLs. A URL is a request for this machine to connect somewhere, so:

- every address its host resolves to, or that it is, must be public: loopback, private, link-local
  (where cloud metadata services answer), shared, unique-local, site-local, multicast and reserved
  addresses are refused unless the operator named their network. IPv6 addresses that carry an
  IPv4 one (mapped, compatible, SIIT, NAT64, 6to4, Teredo) reach it through a translator or a
  tunnel: the IPv4 address is judged as itself, and the ranges of translators and tunnels are
  refused as well unless named (``MediaUrls.refusal``);
- the connection goes to the address that was checked, not to a second lookup's answer, so a
  DNS answer that changes in between (DNS rebinding) cannot move it; TLS still verifies the
  certificate against the URL's host name;
- redirects are followed, at most ``MAX_REDIRECTS``, each checked the same way;
- the fetches of one request share one deadline and one byte budget, one at a time, each on a
  thread of its own, so slow hosts hold neither the threads that render chats nor other
  requests' fetches; at the deadline the connection is shut down and a host name's resolution
  no longer waited for, so no fetch outlasts it (``_resolved``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import http.client
import ipaddress
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urljoin, urlsplit

from llamactx._media import MAX_IMAGE_BYTES, MEDIA_URL_MAX_BYTES, MEDIA_URL_TIMEOUT
from llamactx.server._addresses import Address, Network, carried_ipv4, literal, public, unmapped
from llamactx.server._errors import ApiError

__all__ = ["MAX_REDIRECTS", "MediaUrlPolicy", "MediaUrls", "refuse_media_urls"]

#: Redirects followed for one image URL.
MAX_REDIRECTS = 3
#: Fetches and resolutions running at once, for all requests: each has a thread of its own (a
#: resolution past its deadline keeps one until the system's resolver gives up), so their number
#: is bounded here; a request that would pass it is a 503 at once, never a wait.
MAX_FETCH_THREADS = 64
_FETCH_THREADS = threading.BoundedSemaphore(MAX_FETCH_THREADS)
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024
_IMAGE_TYPE = re.compile(r"image/[a-z0-9.+-]+", re.IGNORECASE)
_T = TypeVar("_T")


@dataclass(frozen=True)
class MediaUrlPolicy:
    """What a server may fetch for ``http(s)://`` image URLs (``create_app(media_urls=...)``,
    ``llamactx serve --allow-media-urls``).

    ``max_bytes`` bounds what all the image URLs of one request bring together (each is also at
    most ``MAX_IMAGE_BYTES``, as a ``data:`` URL is), ``timeout`` (seconds) the time all of them
    take together, resolutions, connections and redirects included. ``allowed_networks`` (CIDR
    strings such as ``"10.1.2.0/24"``) are networks that are not public but may be fetched from,
    such as an intranet's image store; no other non-public address ever is. An IPv6 address that a
    translator or tunnel carries to an IPv4 host (NAT64, 6to4, Teredo, ...) is fetched from only
    where an allowed network holds it (such as ``"64:ff9b::/96"``) and the IPv4 address it carries
    is public or allowed as well. ``ssl_context`` verifies ``https://`` hosts (default: the
    system's certificate authorities).
    """

    max_bytes: int = MEDIA_URL_MAX_BYTES
    timeout: float = MEDIA_URL_TIMEOUT
    allowed_networks: Sequence[str] = ()
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {self.max_bytes}")
        if not 0 < self.timeout <= 600:
            raise ValueError(f"timeout must be in (0, 600] seconds, got {self.timeout}")
        for network in self.allowed_networks:
            ipaddress.ip_network(network)  # ValueError names a malformed one


def refuse_media_urls(messages: Sequence[Mapping[str, Any]]) -> None:
    """``ApiError`` 400 for a message with an ``http(s)://`` image URL, on a server that fetches
    none: the message says how to allow them."""
    for _part, url in _http_image_urls(messages):
        raise ApiError(
            400,
            f"this server does not fetch image URLs ({url[:60]!r}); send the image as a data:image/...;base64 "
            "URL, or start the server with --allow-media-urls",
            param="messages",
            code="media_url_refused",
        )


class MediaUrls:
    """Fetches the ``http(s)://`` image URLs of chats under a ``MediaUrlPolicy``."""

    def __init__(self, policy: MediaUrlPolicy) -> None:
        self.policy = policy
        self.networks: tuple[Network, ...] = tuple(ipaddress.ip_network(net) for net in policy.allowed_networks)
        self.ssl_context = policy.ssl_context or ssl.create_default_context()

    async def inline(self, messages: Sequence[MutableMapping[str, Any]]) -> None:
        """Replaces, in place, each ``http(s)://`` image URL of ``messages`` with a ``data:`` URL
        of what it holds. ``ApiError`` 400 (param ``messages``) for a URL refused, failing, too
        large or too slow."""
        deadline = time.monotonic() + self.policy.timeout
        budget = self.policy.max_bytes
        for part, url in _http_image_urls(messages):
            fetch = asyncio.wrap_future(_on_a_thread_of_its_own(functools.partial(self._fetch, url, deadline, budget)))
            try:
                data, media_type = await asyncio.wait_for(fetch, max(0.0, deadline - time.monotonic()) + 0.5)
            except (TimeoutError, asyncio.TimeoutError):
                raise _refused(url, f"not fetched within {self.policy.timeout:g} s") from None
            budget -= len(data)
            encoded = base64.b64encode(data).decode("ascii")
            part["image_url"] = {**part["image_url"], "url": f"data:{media_type};base64,{encoded}"}

    def _fetch(self, url: str, deadline: float, budget: int) -> tuple[bytes, str]:
        """What ``url`` holds (following redirects) and its image media type, at most
        ``budget`` bytes by ``deadline``."""
        for _ in range(MAX_REDIRECTS + 1):
            status, location, data, media_type = self._get(url, deadline, budget)
            if status not in _REDIRECTS:
                if status != 200:
                    raise _refused(url, f"its host answered HTTP {status}")
                return data, media_type
            if not location:
                raise _refused(url, f"its host answered HTTP {status} without a Location")
            url = urljoin(url, location)
        raise _refused(url, f"more than {MAX_REDIRECTS} redirects")

    def _get(self, url: str, deadline: float, budget: int) -> tuple[int, str | None, bytes, str]:
        """One GET of ``url``: the status, the redirect's location, the body (of a 200) and its
        media type."""
        try:
            host, port, path, secure = _parts(url)
            addresses = self._vetted_addresses(url, host, port, deadline)
            connection: http.client.HTTPConnection
            if secure:
                connection = _PinnedHTTPSConnection(host, addresses, port, _left(deadline), self.ssl_context)
            else:
                connection = _PinnedHTTPConnection(host, addresses, port, _left(deadline))
            guard: threading.Timer | None = None
            try:
                connection.connect()
                guard = _cut_at(connection.sock, deadline)
                connection.request("GET", path, headers={"Accept": "image/*", "User-Agent": "llamactx"})
                with connection.getresponse() as response:
                    if response.status != 200:
                        return response.status, response.getheader("Location"), b"", ""
                    length = response.getheader("Content-Length")
                    if length is not None and length.isdigit() and int(length) > min(budget, MAX_IMAGE_BYTES):
                        raise _too_large(url, budget)
                    data = _body(response, url, deadline, budget)
                    kind = (response.getheader("Content-Type") or "").split(";")[0].strip()
                    return 200, None, data, kind if _IMAGE_TYPE.fullmatch(kind) else "image/unknown"
            finally:
                if guard is not None:
                    guard.cancel()
                connection.close()
        except (OSError, http.client.HTTPException, ValueError, UnicodeError) as error:
            if isinstance(error, TimeoutError) or time.monotonic() >= deadline:  # or cut at the deadline
                raise _refused(url, f"not fetched within {self.policy.timeout:g} s") from None
            raise _refused(url, f"it could not be fetched: {type(error).__name__}: {str(error)[:200]}") from None

    def refusal(self, address: Address) -> str | None:
        """Why this fetcher may not connect to ``address``, or None where it may: the address and
        every IPv4 address it carries (``carried_ipv4``) must each be public (``public``) or in an
        allowed network. The one judge of every address, a URL's own or a host name's."""
        address = unmapped(address)
        for judged in (address, *carried_ipv4(address)):
            if not public(judged) and not any(judged in network for network in self.networks):
                carried = "" if judged == address else f" (it carries {judged})"
                return f"{address}, which is not a public address{carried}"
        return None

    def _vetted_addresses(self, url: str, host: str, port: int, deadline: float) -> list[str]:
        """The addresses to connect to for ``host``, in the resolver's order (by ``deadline``):
        every one must pass ``refusal``."""
        addresses = literal(host)
        if addresses is None:
            try:
                addresses = _resolved(host, port, deadline)
            except socket.gaierror as error:
                raise _refused(url, f"its host does not resolve: {error.strerror}") from None
        for address in addresses:
            if (why := self.refusal(address)) is not None:
                raise _refused(url, f"its host resolves to {why}")
        return list(dict.fromkeys(str(unmapped(address)) for address in addresses))


def _http_image_urls(messages: Iterable[Mapping[str, Any]]) -> Iterator[tuple[MutableMapping[str, Any], str]]:
    """Each ``image_url`` part of ``messages`` whose URL is an ``http(s)://`` one, with that URL."""
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, MutableMapping) and part.get("type") == "image_url":
                image_url = part.get("image_url")
                url = image_url.get("url") if isinstance(image_url, Mapping) else None
                if isinstance(url, str) and url.lower().startswith(("http://", "https://")):
                    yield part, url


def _parts(url: str) -> tuple[str, int, str, bool]:
    """The host (IDNA-encoded), port, path with query, and whether it is ``https``, of ``url``."""
    split = urlsplit(url)
    if split.scheme.lower() not in ("http", "https"):
        raise ValueError(f"only http(s) URLs are fetched, not {split.scheme[:16]!r} ones")
    if split.username is not None or split.password is not None:
        raise ValueError("URLs with credentials are not fetched")
    if not split.hostname:
        raise ValueError("the URL has no host")
    secure = split.scheme.lower() == "https"
    host = split.hostname.encode("idna").decode("ascii")
    path = (split.path or "/") + (f"?{split.query}" if split.query else "")
    return host, split.port or (443 if secure else 80), path, secure


def _resolved(host: str, port: int, deadline: float) -> list[Address]:
    """The addresses the system's resolver gives ``host``, by ``deadline`` (``TimeoutError``
    past it). A resolution cannot be interrupted, so it runs on a thread of its own: one that
    outlives the deadline keeps that thread until the resolver gives up (resolv.conf's timeouts),
    and nothing waits for it."""
    answer = _on_a_thread_of_its_own(lambda: socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in answer.result(_left(deadline))]


def _on_a_thread_of_its_own(work: Callable[[], _T]) -> Future[_T]:
    """What ``work()`` returns or raises, run on a new daemon thread. Fetches and resolutions hold
    no shared thread, so no request waits for another's slow hosts; a request fetches one URL at a
    time, and each fetch ends by its request's deadline. ``ApiError`` 503 when
    ``MAX_FETCH_THREADS`` already run."""
    if not _FETCH_THREADS.acquire(blocking=False):
        raise ApiError(
            503, f"the server is already fetching {MAX_FETCH_THREADS} image URLs: try again", code="media_url_busy"
        )
    outcome: Future[_T] = Future()

    def run() -> None:
        try:
            if outcome.set_running_or_notify_cancel():
                try:
                    outcome.set_result(work())
                except Exception as error:  # raised where the outcome is awaited
                    outcome.set_exception(error)
        finally:
            _FETCH_THREADS.release()

    threading.Thread(target=run, name="llamactx-media-url", daemon=True).start()
    return outcome


def _cut_at(sock: socket.socket | None, deadline: float) -> threading.Timer:
    """A timer that shuts ``sock`` down at ``deadline``, so that no read of a host that answers
    slowly (a byte at a time, each within any socket timeout) outlasts it."""

    def cut() -> None:
        if sock is not None:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the TCP socket under any TLS

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), cut)
    timer.daemon = True
    timer.start()
    return timer


def _body(response: http.client.HTTPResponse, url: str, deadline: float, budget: int) -> bytes:
    """The body of ``response``, read by ``deadline``: ``ApiError`` past ``budget`` bytes."""
    limit = min(budget, MAX_IMAGE_BYTES)
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read1(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise _too_large(url, budget)
        chunks.append(chunk)
    _left(deadline)  # an end at the deadline is the cut, not the body's end
    return b"".join(chunks)


def _left(deadline: float) -> float:
    """Seconds until ``deadline``; ``TimeoutError`` once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _refused(url: str, why: str) -> ApiError:
    message = f"the image URL {url[:80]!r} was not fetched: {why}"
    return ApiError(400, message, param="messages", code="media_url_refused")


def _too_large(url: str, budget: int) -> ApiError:
    return _refused(url, f"it holds more than the {min(budget, MAX_IMAGE_BYTES)} bytes left to this request's images")


def _connected(addresses: Sequence[str], port: int, timeout: float | None) -> socket.socket:
    """A connection to the first of ``addresses`` that answers (as ``socket.create_connection``
    tries a host's addresses)."""
    failure: OSError = OSError("no address")
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout)
        except OSError as error:
            failure = error
    raise failure


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to ``host`` that connects to one of ``addresses``, checked before."""

    def __init__(self, host: str, addresses: Sequence[str], port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.addresses = addresses

    def connect(self) -> None:
        self.sock = _connected(self.addresses, self.port, self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection to ``host`` that connects to one of ``addresses``, checked before,
    and verifies the certificate against ``host``."""

    def __init__(self, host: str, addresses: Sequence[str], port: int, timeout: float, context: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self.addresses = addresses
        self.tls = context

    def connect(self) -> None:
        raw = _connected(self.addresses, self.port, self.timeout)
        try:
            self.sock = self.tls.wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise
