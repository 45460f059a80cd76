"""How a rank's messages reach the host of the simulator: three transports, one interface.

Every transport hands out connections with multiprocessing's Connection interface:
send(obj), recv(), poll(timeout) and close(). The messages are typed dataclasses
(protocol.py, exoframe/engine/ipc/messages.py).

- `in_process()`: both ends in one process (replays, unit tests); thread-safe.
- pipes: `multiprocessing.Pipe()`, between the launcher and the ranks it forks.
- TCP: `Listener` and `connect()`, for ranks on other machines. Both ends prove that they
  hold the run's token (an HMAC of both sides' fresh nonces and their role) before a
  message is read, so a foreign connection, or one sending garbage, is refused and logged
  without disturbing the run. The connection is authenticated at its start, not encrypted
  or signed message by message: on a network where someone could take over a connection
  in flight, run the ranks inside a VPN or SSH tunnel.

A QueueConnection's close() does not wake its peer (a pipe's or socket's recv() raises
EOFError once the other end is closed): in-process ends stop by a message.
"""
from __future__ import annotations

import hmac
import os
import socket
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import Protocol, runtime_checkable

MAGIC = b"exoframe-transport-1"
NONCE_BYTES = 32
DIGEST_BYTES = 32  # sha256
HANDSHAKE_SECONDS = 5.0  # a peer that has not proved itself by then is dropped


@runtime_checkable
class Conn(Protocol):
    """What every connection a message crosses offers: a pipe's or socket's Connection, a
    QueueConnection here, a packed node's NodeConn (engine/node/packing.py)."""

    def send(self, obj) -> None: ...

    def recv(self): ...

    def poll(self, timeout: float | None = 0.0) -> bool: ...

    def close(self) -> None: ...


class TransportError(Exception):
    pass


class HandshakeError(TransportError):
    """The peer answered but did not prove that it holds the run's token."""


class QueueConnection:
    """One end of an in-process connection."""

    def __init__(self, inbox: deque, inbox_ready: threading.Condition, outbox: deque,
                 outbox_ready: threading.Condition, arrivals: deque | None = None, tag=None):
        self._inbox, self._inbox_ready = inbox, inbox_ready
        self._outbox, self._outbox_ready = outbox, outbox_ready
        self._arrivals, self._tag = arrivals, tag

    def send(self, obj):
        with self._outbox_ready:
            self._outbox.append(obj)
            if self._arrivals is not None:
                self._arrivals.append(self._tag)
            self._outbox_ready.notify_all()

    def recv(self):
        with self._inbox_ready:
            self._inbox_ready.wait_for(lambda: self._inbox)
            return self._inbox.popleft()

    def poll(self, timeout: float | None = 0.0) -> bool:
        with self._inbox_ready:
            return bool(self._inbox_ready.wait_for(lambda: self._inbox, timeout))

    def close(self):
        pass  # nothing to release; the peer stops by a message (see the module docstring)


class Arrivals:
    """Where one thread waits for a message on any of many in-process connections
    (`in_process(arrivals=...)`): `wait()` returns the tags of those that sent, in order."""

    def __init__(self):
        self.ready = threading.Condition()
        self.tags = deque()

    def wait(self) -> list:
        with self.ready:
            self.ready.wait_for(lambda: self.tags)
            tags = list(self.tags)
            self.tags.clear()  # in place: the connections hold this deque
            return tags


def in_process(arrivals: Arrivals | None = None, tag=None) -> tuple[QueueConnection,
                                                                    QueueConnection]:
    """Two connected ends (a, b) in one process. With `arrivals`, what b sends to a is also
    announced there with `tag`, so that one thread can wait on many a ends at once."""
    a_to_b, b_to_a = deque(), deque()
    a_ready = arrivals.ready if arrivals is not None else threading.Condition()
    b_ready = threading.Condition()
    a = QueueConnection(b_to_a, a_ready, a_to_b, b_ready)
    b = QueueConnection(a_to_b, b_ready, b_to_a, a_ready,
                        arrivals.tags if arrivals is not None else None, tag)
    return a, b


def _digest(token: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What a side proves: the token's HMAC of its role and both sides' fresh nonces (so a
    proof cannot be replayed, nor reflected from one role to the other)."""
    return hmac.new(token, MAGIC + role + server_nonce + client_nonce, "sha256").digest()


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise HandshakeError("the peer closed the connection")
        data += chunk
    return data


def _prove_and_check(sock: socket.socket, token: bytes, server: bool):
    """The handshake. The listening side sends its nonce; the connecting one answers with
    its own nonce and its proof; the listening side checks it and sends its own proof."""
    if server:
        server_nonce = os.urandom(NONCE_BYTES)
        sock.sendall(MAGIC + server_nonce)
        client_nonce = _read_exactly(sock, NONCE_BYTES)
        proof = _read_exactly(sock, DIGEST_BYTES)
        if not hmac.compare_digest(proof, _digest(token, b"client", server_nonce,
                                                  client_nonce)):
            raise HandshakeError("it did not present this run's token")
        sock.sendall(_digest(token, b"server", server_nonce, client_nonce))
    else:
        if _read_exactly(sock, len(MAGIC)) != MAGIC:
            raise HandshakeError("it is not an exoframe service")
        server_nonce, client_nonce = _read_exactly(sock, NONCE_BYTES), os.urandom(NONCE_BYTES)
        sock.sendall(client_nonce + _digest(token, b"client", server_nonce, client_nonce))
        if not hmac.compare_digest(_read_exactly(sock, DIGEST_BYTES),
                                   _digest(token, b"server", server_nonce, client_nonce)):
            raise HandshakeError("it did not present this run's token")


class Listener:
    """A listening TCP socket (on `host`: loopback unless the user names an address) whose
    accepted connections hold the run's token."""

    def __init__(self, host: str, token: bytes, port: int = 0):
        self.token = token
        self.sock = socket.create_server((host, port))
        self.address = self.sock.getsockname()[:2]

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept(self, log=None) -> Connection | None:
        """Accept one connection; None (logged) when the peer does not prove it holds the
        token within HANDSHAKE_SECONDS."""
        try:
            sock, peer = self.sock.accept()
        except OSError as e:  # the peer gave up at once, or no descriptors left
            print(f"exoframe: a connection failed as it was accepted ({e}).",
                  file=log or sys.stderr, flush=True)
            return None
        sock.settimeout(HANDSHAKE_SECONDS)
        try:
            _prove_and_check(sock, self.token, server=True)
        except (OSError, TransportError) as e:
            sock.close()
            why = str(e) if isinstance(e, TransportError) else f"its handshake failed ({e})"
            print(f"exoframe: ignored a connection from {peer[0]}:{peer[1]}: {why}.",
                  file=log or sys.stderr, flush=True)
            return None
        return _connection(sock)

    def close(self):
        self.sock.close()


def connect_raw(host: str, port: int, timeout: float) -> socket.socket:
    """A plain TCP connection, retrying refused ones until `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, port), timeout=max(0.1, deadline -
                                                                        time.monotonic()))
        except OSError as e:
            if time.monotonic() >= deadline:
                raise TransportError(f"could not connect to {host}:{port} within {timeout:g} s "
                                     f"({e.strerror or e})") from None
            time.sleep(0.2)


def connect(host: str, port: int, token: bytes, timeout: float) -> Connection:
    """Connect to a Listener, retrying refused connections until `timeout` seconds."""
    deadline = time.monotonic() + timeout
    sock = connect_raw(host, port, timeout)
    sock.settimeout(max(0.1, min(HANDSHAKE_SECONDS, deadline - time.monotonic())))
    try:
        _prove_and_check(sock, token, server=False)
    except (OSError, TransportError) as e:
        sock.close()
        raise HandshakeError(f"{host}:{port} refused the handshake: {e}") from None
    return _connection(sock)


def _connection(sock: socket.socket) -> Connection:
    sock.settimeout(None)
    # Messages are small questions and answers: Nagle's algorithm would hold each one back
    # for the peer's delayed acknowledgement.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return Connection(sock.detach())
