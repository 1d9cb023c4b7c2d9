"""Hosts as hosts: each ``serve`` in a Linux network namespace of its own, reaching
PostgreSQL and the gateway over links that the test can cut.

The topology, made by :class:`Net` with ``ip netns`` and removed at the end::

    host a ──pg──┐                     ┌── brp 10.N.1.1:5432  PostgreSQL
                 ├── bridge namespace ─┤
    host a ──gw──┘                     └── brg 10.N.2.1       hooks stand-in, one proxy a host

Each host has two veth links into the bridge namespace, one to each bridge, so that it can
be cut from PostgreSQL, from the gateway, or from both, by taking the bridge's end of a link
down (packets then vanish, as in a real partition: no refusal comes back). The kernel here
has no ``netem`` and there is no ``iptables``, so delay and a slow answer go through a TCP
proxy of the test's own (:class:`Proxy`), one per host, between the host and the hooks
stand-in (:class:`~tests.wake_sink.WakeSink`).

The stand-in and the proxies are threads of the test process whose sockets were made inside
the bridge namespace (:func:`inside`: ``setns(2)`` on the calling thread; a thread started
there stays there). PostgreSQL runs there as a process (``ip netns exec``). Only addresses
inside namespaces the test made are used.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def why_unavailable() -> str | None:
    """None when namespaces can be made here; else the reason."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if not shutil.which("ip"):
        return "there is no ip command (iproute2)"
    probe = f"swprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextlib.contextmanager
def inside(ns: str) -> Iterator[None]:
    """This thread in network namespace ``ns``: sockets made meanwhile, and threads started
    meanwhile, belong to it."""
    here = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    there = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        _setns(there)
        try:
            yield
        finally:
            _setns(here)
    finally:
        os.close(here)
        os.close(there)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Net:
    """The bridge namespace with its two bridges, and a namespace a host."""

    def __init__(self) -> None:
        self.tag = f"sw{secrets.token_hex(3)}"
        self.subnet = f"10.{secrets.randbelow(200) + 20}"  # 10.N.1.0/24 and 10.N.2.0/24
        self.bridge = f"{self.tag}-br"
        self.hosts: list[str] = []
        ip("netns", "add", self.bridge)
        ip("-n", self.bridge, "link", "set", "lo", "up")
        for side in ("1", "2"):
            dev = f"br{side}"
            ip("-n", self.bridge, "link", "add", dev, "type", "bridge")
            ip("-n", self.bridge, "addr", "add", f"{self.subnet}.{side}.1/24", "dev", dev)
            ip("-n", self.bridge, "link", "set", dev, "up")

    @property
    def pg_address(self) -> str:
        return f"{self.subnet}.1.1"

    @property
    def gateway_address(self) -> str:
        return f"{self.subnet}.2.1"

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def add_host(self, host: str) -> str:
        """A namespace for ``host``, linked to both bridges; its name."""
        ns = self.ns(host)
        n = len(self.hosts) + 10
        self.hosts.append(host)
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
        for side, name in (("1", "pg"), ("2", "gw")):
            peer = f"{name}-{host}"
            ip("link", "add", name, "netns", ns, "type", "veth", "peer", peer, "netns", self.bridge)
            ip("-n", self.bridge, "link", "set", peer, "master", f"br{side}", "up")
            ip("-n", ns, "addr", "add", f"{self.subnet}.{side}.{n}/24", "dev", name)
            ip("-n", ns, "link", "set", name, "up")
        return ns

    def cut(self, host: str, links: tuple[str, ...], down: bool = True) -> None:
        """Take ``host``'s links (``pg``, ``gw``) down at the bridge's end, or up again."""
        for name in links:
            ip("-n", self.bridge, "link", "set", f"{name}-{host}", "down" if down else "up")

    def close(self) -> None:
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", self.ns(host)], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.bridge], capture_output=True)


@dataclass
class Relayed:
    """One connection through a :class:`Proxy`: what the caller sent, and whether the
    whole answer reached it (the stand-in's answer ends the connection: HTTP/1.0)."""

    host: str
    opened: float  # time.monotonic()
    request: bytearray = field(default_factory=bytearray)
    delivered: float | None = None  # when the answer's last byte went to the caller

    @property
    def key(self) -> str:
        """``<watcher> <notice text>``, as the wake named them."""
        body = bytes(self.request).partition(b"\r\n\r\n")[2]
        with contextlib.suppress(ValueError, AttributeError):
            wake = json.loads(body)
            return f"{wake.get('sessionKey') or ''} {wake.get('text')}"
        return ""


class Proxy:
    """A TCP proxy from a host to the hooks stand-in: ``delay_s`` before each chunk either
    way; ``trickle_s`` releases the answer a line at a time, that long apart (a gateway
    that sends its headers at once and its body much later); ``swallow``: the answer never
    comes back (a one-way black hole: the request reaches the gateway, which answers into
    the void, until the caller gives up)."""

    def __init__(self, host: str, listen: str, upstream: tuple[str, int]) -> None:
        self.host, self.upstream = host, upstream
        self.delay_s = 0.0
        self.trickle_s = 0.0
        self.swallow = False
        self.relayed: list[Relayed] = []
        self._lock = threading.Lock()
        self.server = socket.create_server((listen, 0))
        self.port: int = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                caller, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(caller,), daemon=True).start()

    def _relay(self, caller: socket.socket) -> None:
        record = Relayed(self.host, time.monotonic())
        with self._lock:
            self.relayed.append(record)
        try:
            gateway = socket.create_connection(self.upstream, timeout=60)
        except OSError:
            caller.close()
            return
        threading.Thread(target=self._forward, args=(caller, gateway, record), daemon=True).start()
        self._answer(gateway, caller, record)

    def _forward(self, caller: socket.socket, gateway: socket.socket, record: Relayed) -> None:
        with contextlib.suppress(OSError):
            while chunk := caller.recv(65536):
                record.request += chunk
                time.sleep(self.delay_s)
                gateway.sendall(chunk)

    def _answer(self, gateway: socket.socket, caller: socket.socket, record: Relayed) -> None:
        swallowed = False
        try:
            while chunk := gateway.recv(65536):
                time.sleep(self.delay_s)
                if self.swallow or swallowed:
                    swallowed = True  # this answer is lost for good
                elif self.trickle_s:
                    for line in chunk.splitlines(keepends=True):
                        caller.sendall(line)
                        time.sleep(self.trickle_s)
                else:
                    caller.sendall(chunk)
            if swallowed:  # the caller gives up, and goes
                caller.recv(1)
                return
            caller.shutdown(socket.SHUT_WR)
            caller.recv(1)  # the caller closes once it read the whole answer
            record.delivered = time.monotonic()
        except OSError:
            pass  # the caller went first: it never had the whole answer
        finally:
            gateway.close()
            caller.close()

    def close(self) -> None:
        self.server.close()
