"""Where a TCP party listens (:class:`TcpAddress`), and how a connection's peer is named in logs."""

from __future__ import annotations

import dataclasses
import ipaddress

import trio


@dataclasses.dataclass(frozen=True)
class TcpAddress:
    """Where a party listens.

    Attributes:
        host: host name or IP address (IPv6 without brackets).
        port: TCP port, 0 to 65535 (0 lets :meth:`TcpTransport.serve` pick a free port).

    Raises:
        ValueError: empty host or port out of range.
        TypeError: host is not a string or port is not an int.
    """

    host: str
    port: int

    def __post_init__(self) -> None:
        if not isinstance(self.host, str):
            raise TypeError(f"TcpAddress.host must be a str, got {type(self.host).__name__}")
        if not self.host:
            raise ValueError("TcpAddress.host must not be empty")
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise TypeError(f"TcpAddress.port must be an int, got {type(self.port).__name__}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"TcpAddress.port must be in 0..65535, got {self.port}")

    @classmethod
    def parse(cls, text: str) -> "TcpAddress":
        """Parse ``"host:port"`` (IPv6 as ``"[::1]:port"``).

        Raises:
            ValueError: the text is not ``host:port`` with a port in 0..65535.
        """
        text = text.strip()
        if text.startswith("["):
            host, sep, rest = text[1:].partition("]")
            if not sep or not rest.startswith(":"):
                raise ValueError(f"bad address {text!r}: expected '[ipv6]:port'")
            port_text = rest[1:]
        else:
            host, sep, port_text = text.rpartition(":")
            if not sep:
                raise ValueError(f"bad address {text!r}: expected 'host:port'")
            if ":" in host:
                raise ValueError(f"bad address {text!r}: write IPv6 addresses as '[ipv6]:port'")
        if not host:
            raise ValueError(f"bad address {text!r}: the host is empty")
        if not port_text.isdigit():
            raise ValueError(f"bad address {text!r}: the port must be a number")
        port = int(port_text)
        if port > 65535:
            raise ValueError(f"bad address {text!r}: the port must be in 0..65535")
        return cls(host, port)

    def __str__(self) -> str:
        try:
            is_v6 = ipaddress.ip_address(self.host).version == 6
        except ValueError:
            is_v6 = False
        return f"[{self.host}]:{self.port}" if is_v6 else f"{self.host}:{self.port}"


def peername(stream: trio.SocketStream) -> str:
    """``"host:port"`` of a connection's peer, for logs (``"<unknown peer>"`` if the socket cannot say)."""
    try:
        host, port, *_ = stream.socket.getpeername()
    except (OSError, ValueError, TypeError):
        return "<unknown peer>"
    return str(TcpAddress(str(host), int(port)))
