"""Runs Python with loopback as the only network interface: in a network namespace of its own
(``unshare``, as an unprivileged user mapped to root), with ``lo`` brought up. For what binds
every interface and cannot be told otherwise (Ray's servers).

    python loopback_only.py FILE [ARGS...]    or    python loopback_only.py -m MODULE [ARGS...]
"""

from __future__ import annotations

import fcntl
import runpy
import socket
import struct
import sys

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IFREQ = "16sH14x"  # struct ifreq: the interface name, then its flags


def command(*arguments: str) -> list[str]:
    """The command line that runs ``python ARGUMENTS`` with loopback only."""
    return ["unshare", "--user", "--map-root-user", "--net", sys.executable, __file__, *arguments]


def bring_loopback_up() -> None:
    """A new network namespace starts with ``lo`` down."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        flags = struct.unpack(IFREQ, fcntl.ioctl(probe, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))[1]
        fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))


if __name__ == "__main__":
    bring_loopback_up()
    if sys.argv[1] == "-m":
        sys.argv = sys.argv[2:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
