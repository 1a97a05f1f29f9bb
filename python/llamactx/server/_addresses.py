"""Which network addresses an image fetch may reach: the address a host spells, the IPv4
address an IPv6 one carries through a translator or a tunnel, and whether an address is the
internet's own (``_media_urls`` refuses the rest unless its operator named their network)."""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["Address", "Network", "carried_ipv4", "literal", "public", "unmapped"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


#: IPv6 ranges whose last 32 bits are an IPv4 address that a packet to them reaches.
_IPV4_IN_LAST_32_BITS = tuple(
    ipaddress.IPv6Network(network)
    for network in (
        "::/96",  # IPv4-compatible (RFC 4291, deprecated; Linux's sit0 still tunnels them to the IPv4 host)
        "::ffff:0:0:0/96",  # SIIT, IPv4-translated (RFC 2765)
        "64:ff9b::/96",  # NAT64, the well-known prefix (RFC 6052)
    )
)


#: IPv6 ranges that translators and tunnels carry to IPv4 hosts, or that route inside a site:
#: not the internet's own, though Python calls several of them global. Refused unless an allowed
#: network holds the address.
_TRANSLATED = (
    *_IPV4_IN_LAST_32_BITS,
    *(
        ipaddress.IPv6Network(network)
        for network in (
            "64:ff9b:1::/48",  # NAT64, local use (RFC 8215): where the IPv4 address sits is the site's choice
            "2001::/32",  # Teredo (RFC 4380)
            "2002::/16",  # 6to4 (RFC 3056)
            "fec0::/10",  # site-local (RFC 3879, deprecated, yet routed where still configured)
        )
    ),
)


def literal(host: str) -> list[Address] | None:
    """The address ``host`` spells, in any form the system's resolver reads as one (``::1``,
    ``127.0.0.1``, ``2130706433``, ``0x7f.1``); None for a host name."""
    try:
        return [ipaddress.ip_address(host.split("%")[0])]
    except ValueError:
        pass
    try:
        return [ipaddress.IPv4Address(socket.inet_aton(host))]
    except OSError:
        return None


def unmapped(address: Address) -> Address:
    """The IPv4 address an IPv4-mapped IPv6 address (``::ffff:a.b.c.d``) is: sockets connect to it."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def carried_ipv4(address: Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses that a packet to ``address`` reaches through a translator or tunnel:
    the last 32 bits of a compatible, SIIT or NAT64 address, a 6to4 address's bits 16-47, a Teredo
    address's server (bits 32-63) and client (the last 32 bits, inverted)."""
    if isinstance(address, ipaddress.IPv4Address):
        return ()
    if any(address in network for network in _IPV4_IN_LAST_32_BITS):
        return (ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF),)
    if address.sixtofour is not None:
        return (address.sixtofour,)
    return address.teredo or ()


def public(address: Address) -> bool:
    """Whether ``address`` is the internet's own: global, unicast, allocated, and in no range of
    translators or tunnels (``_TRANSLATED``)."""
    return (
        address.is_global
        and not address.is_multicast
        and not address.is_reserved
        and not any(address in network for network in _TRANSLATED)
    )
