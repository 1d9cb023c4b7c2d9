"""The wake's HTTP call against real sockets on loopback: a fresh connection per call, the
request written only once connected and ``ready()`` said so, and a call that ends without a
whole answer reset (the peer reads a reset, not an end), so that nothing of it can arrive
later. That a reset drops what a cut link still held is the network-namespace harness's to
show (tests/delivery/test_hosts_netns.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from monitor.delivery.transport import CallFailed, OneShotTransport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\n"


class Server:
    """A loopback server running ``handler`` for each connection; what each connection's
    peer did at its end (``end``: ``reset``, ``closed``) is recorded."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.received: list[bytes] = []
        self.ends: list[str] = []
        self.url = ""

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
            while data := await reader.read(4096):  # until the client ends the connection
                self.received.append(data)
            self.ends.append("closed")
        except ConnectionResetError:
            self.ends.append("reset")
        finally:
            writer.close()


Serve = Callable[[Handler], Awaitable[Server]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[Server]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> Server:
        made = Server(handler)
        server = await asyncio.start_server(made, "127.0.0.1", 0)
        servers.append(server)
        made.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hooks/wake"
        return made

    yield start
    for server in servers:
        server.close()


async def _until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not check():
            await asyncio.sleep(0.01)


async def answer(text: bytes) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(text)
        await writer.drain()

    return handler


async def test_each_call_connects_afresh_and_writes_only_once_ready(serve: Serve) -> None:
    got: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.append(await reader.readuntil(b"\r\n\r\n") + await reader.readexactly(2))
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{"ok": "queued"}'[:-1])
        await writer.drain()

    server = await serve(handler)
    transport = OneShotTransport()
    asked: list[tuple[int, int]] = []

    async def ready() -> bool:  # connected, and nothing written yet
        await _until(lambda: server.connections == len(asked) + 1)
        asked.append((server.connections, len(got)))
        return True

    for _ in range(2):
        reply = await transport.post(server.url, b"{}", {"Authorization": "Bearer t"}, ready)
        assert reply is not None and reply.status == 200 and reply.body == b'{"ok": "queued"}'[:-1]
    assert asked == [(1, 0), (2, 1)]  # each call its own connection, asked before writing
    assert got[0].startswith(b"POST /hooks/wake HTTP/1.1\r\n")
    assert b"connection: close\r\n" in got[0].lower()
    await _until(lambda: len(server.ends) == 2)
    assert server.ends == ["closed", "closed"]  # a whole answer: ended plainly


async def test_the_host_header_never_carries_the_url_s_userinfo(serve: Serve) -> None:
    got: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    server = await serve(handler)
    url = server.url.replace("http://", "http://user:secret@")
    reply = await OneShotTransport().post(url, b"{}", {})
    assert reply is not None and reply.status == 200
    netloc = server.url.split("/")[2].encode()
    assert f"host: {netloc.decode()}\r\n".encode() in got[0].lower()
    assert b"secret" not in got[0]


async def test_a_call_not_ready_writes_nothing(serve: Serve) -> None:
    server = await serve(lambda reader, writer: asyncio.sleep(0))

    async def withdrawn() -> bool:
        return False

    assert await OneShotTransport().post(server.url, b"{}", {}, withdrawn) is None
    await _until(lambda: len(server.ends) == 1)
    assert server.received == []
    assert server.connections == 1


async def test_a_call_given_up_is_reset_so_nothing_of_it_arrives_later(serve: Serve) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # taken, never answered

    server = await serve(silent)
    with pytest.raises(CallFailed) as failed:
        await OneShotTransport(read_s=0.3).post(server.url, b"{}", {})
    assert failed.value.maybe_taken
    assert str(failed.value) == "no answer in time"
    await _until(lambda: len(server.ends) == 1)
    assert server.ends == ["reset"]


async def test_a_cancelled_call_is_reset_too(serve: Serve) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")

    server = await serve(silent)
    call = asyncio.ensure_future(OneShotTransport().post(server.url, b"{}", {}))
    await _until(lambda: server.connections == 1)
    await asyncio.sleep(0.05)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await _until(lambda: len(server.ends) == 1)
    assert server.ends == ["reset"]


@pytest.mark.parametrize(
    ("raw", "status", "body", "retry_after", "location"),
    [
        (b"HTTP/1.1 429 No\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n", 429, b"", "7", None),
        (b"HTTP/1.1 307 X\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n", 307, b"", None, "/x"),
        (OK + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 200, b"abc", None, None),
        (b"HTTP/1.1 100 Go\r\n\r\n" + OK + b"Content-Length: 2\r\n\r\nok", 200, b"ok", None, None),
    ],
)  # fmt: skip
async def test_an_answer_is_read_whole(
    serve: Serve,
    raw: bytes,
    status: int,
    body: bytes,
    retry_after: str | None,
    location: str | None,
) -> None:
    server = await serve(await answer(raw))
    reply = await OneShotTransport().post(server.url, b"{}", {})
    assert reply is not None
    assert (reply.status, reply.body, reply.retry_after, reply.location) == (
        status, body, retry_after, location,
    )  # fmt: skip


async def test_an_answer_to_the_end_of_the_connection_is_read_whole(serve: Serve) -> None:
    async def to_the_end(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    server = await serve(to_the_end)
    reply = await OneShotTransport().post(server.url, b"{}", {})
    assert reply is not None and reply.body == b"all of it"


async def test_a_connection_closed_before_an_answer_may_have_been_taken(serve: Serve) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await serve(hang_up)
    with pytest.raises(CallFailed) as failed:
        await OneShotTransport().post(server.url, b"{}", {})
    assert failed.value.maybe_taken


async def test_a_refused_connection_never_reached_the_gateway() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    asked: list[bool] = []

    async def ready() -> bool:
        asked.append(True)
        return True

    with pytest.raises(CallFailed) as failed:
        await OneShotTransport().post(f"http://127.0.0.1:{port}/hooks/wake", b"{}", {}, ready)
    assert not failed.value.maybe_taken
    assert str(failed.value) == f"cannot connect to 127.0.0.1:{port} (Connection refused)"
    assert asked == []  # never connected: the notice is not read for a call that cannot go
