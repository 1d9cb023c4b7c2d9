"""The wake's HTTP call, each on a connection of its own, ended by a reset when it ends
without a whole answer.

Why not a pooled client: a pooled keep-alive connection can be silently dead (a link cut or
black-holed one way while it idled). A request written to it sits in the kernel's send
queue, and a client that times out closes the connection gracefully, so the kernel keeps
retransmitting: when the link heals, the gateway receives the whole request, long after the
sidecar decided the call went unanswered and a drain took its notice (seen 26.6 s after the
call, in every run of a cut). Here:

- every call connects afresh (``Connection: close``), so no request rides a connection that
  died while idle;
- the request is written only once the connection is up and ``ready()`` (the ledger's read
  of the notice, :func:`monitor.delivery.claims.hold`) said it may go: a connect that took
  seconds is not spent after the last read, so a drain meanwhile withdraws the call;
- a call that ends without a whole answer (a timeout, a cut, a cancellation) is aborted:
  ``SO_LINGER`` 0 and a close, which sends a reset and drops whatever the kernel still held
  to send, so no byte of it reaches the gateway later. What was already on the link may
  still arrive: the bound is :data:`READ_S` after ``ready()``, plus the link's one-way delay.

HTTP/1.1 is h11's (sans-IO, python-hyper): the bytes and the parsing are a well-kept
library's, the socket and its ending ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import SplitResult, urlsplit

import h11

from monitor.errors import connection_reason

CONNECT_S = 3.0  # no connection by then: the gateway never saw the call
READ_S = 10.0  # the request went out and no answer came by then: it may have been taken
MAX_BODY = 64 * 1024  # a wake's answer is a line of JSON: more is read no further
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends RST, drops the send queue


@dataclass(frozen=True, slots=True)
class Reply:
    """What the gateway answered to one call."""

    status: int
    body: bytes = b""
    retry_after: str | None = None
    location: str | None = None  # a redirect's target (never followed)


class CallFailed(Exception):
    """No answer: refused, reset, timed out. ``str()`` is the reason, in words;
    ``maybe_taken``: the request went out, so the gateway may have acted on it."""

    def __init__(self, reason: str, *, maybe_taken: bool = False) -> None:
        super().__init__(reason)
        self.maybe_taken = maybe_taken


Ready = Callable[[], Awaitable[bool]]


class Transport(Protocol):
    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], ready: Ready | None = None
    ) -> Reply | None:
        """One POST; raises :class:`CallFailed` when no answer came. ``ready`` is asked
        once the gateway can be written to, just before the request: False, and nothing is
        sent (None)."""
        ...

    async def close(self) -> None: ...


class OneShotTransport:
    """:class:`monitor.delivery.hooks.Transport` on a fresh connection per call."""

    def __init__(self, connect_s: float = CONNECT_S, read_s: float = READ_S) -> None:
        self._connect_s = connect_s
        self._read_s = read_s
        self._tls: ssl.SSLContext | None = None

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        ready: Ready | None = None,
    ) -> Reply | None:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        host, port = parts.hostname or "", parts.port or (443 if tls else 80)
        if tls and self._tls is None:
            self._tls = ssl.create_default_context()
        try:
            async with asyncio.timeout(self._connect_s):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=self._tls if tls else None
                )
        except (OSError, TimeoutError) as exc:  # never reached the gateway
            raise CallFailed(_unreached(host, port, exc)) from exc
        whole = False  # a whole answer came, or nothing was written: closed, not reset
        try:
            if ready is not None and not await ready():
                whole = True
                return None
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            try:
                async with asyncio.timeout(self._read_s):
                    reply = await _exchange(
                        reader, writer, _host_header(parts), target, body, headers
                    )
            except (OSError, TimeoutError, h11.ProtocolError) as exc:  # it may have been taken
                raise CallFailed(connection_reason(exc), maybe_taken=True) from exc
            whole = True
            return reply
        finally:
            _end(writer, whole)

    async def close(self) -> None:
        """Nothing is kept between calls."""


def _host_header(parts: SplitResult) -> str:
    """The ``Host`` a request names: the URL's host and port as written, never its userinfo
    (``user:password@``, which would go out in clear)."""
    return parts.netloc.rpartition("@")[2]


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    netloc: str,
    target: str,
    body: bytes,
    headers: Mapping[str, str],
) -> Reply:
    conn = h11.Connection(h11.CLIENT)
    head = [("Host", netloc), ("Content-Length", str(len(body))), ("Connection", "close")]
    request = h11.Request(method="POST", target=target, headers=[*head, *headers.items()])
    for part in (request, h11.Data(data=body), h11.EndOfMessage()):
        writer.write(conn.send(part) or b"")
    await writer.drain()
    answer: h11.Response | None = None
    got = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(16 * 1024)
            conn.receive_data(data)  # b"": the peer closed (an error unless the body is whole)
        elif isinstance(event, h11.Response):
            answer = event
        elif isinstance(event, h11.Data):
            got += event.data[: MAX_BODY - len(got)]
        elif isinstance(event, h11.EndOfMessage) and answer is not None:
            said = {k.decode("latin-1"): v.decode("latin-1") for k, v in answer.headers}
            return Reply(
                answer.status_code, bytes(got), said.get("retry-after"), said.get("location")
            )
        elif isinstance(event, h11.ConnectionClosed):
            raise ConnectionResetError("the gateway closed the connection before answering")
        # an informational answer (100 Continue): the real one follows


def _end(writer: asyncio.StreamWriter, whole: bool) -> None:
    """Close; with a reset unless the whole answer came (nothing of the call may arrive
    later)."""
    if not whole:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # closed by the peer: nothing queued to send
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
        writer.transport.abort()
    else:
        writer.close()


def _unreached(host: str, port: int, exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"cannot connect to {host}:{port} (no answer in time)"
    err = exc.errno if isinstance(exc, OSError) else None  # its strerror is asyncio's words
    cause = os.strerror(err) if err else str(exc) or type(exc).__name__
    return f"cannot connect to {host}:{port} ({cause})"
