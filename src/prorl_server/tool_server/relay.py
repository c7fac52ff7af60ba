"""The gateway relay inside a sandbox: TCP on the sandbox's own loopback to the gateway bridge's Unix socket.

A sandbox without network has a loopback of its own and nothing else. The host binds its gateway bridge's
socket into the sandbox (gateway/bridge.py), and the execution server, asked once (`gateway_relay`), listens
on `127.0.0.1:<port>` and relays every connection there, byte for byte, to that socket; an OpenAI client in
the sandbox then reaches its session at `http://127.0.0.1:<port>/v1`. The relay decides nothing: every
check (paths, body size, the session) is the bridge's, on the host, where the sandbox cannot change it.

Bounded: at most MAX_CONNECTIONS at once (more are closed at once), one thread per connection. Standard
library only, imported on the first `gateway_relay` call (the execution server's start stays C modules only).
"""

from __future__ import annotations

import selectors
import socket
import threading

MAX_CONNECTIONS = 32
CHUNK = 64 * 1024


class Relay:
    """Listens on `127.0.0.1:port` and relays each connection to the Unix socket `target`."""

    def __init__(self, target: str, port: int) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            if not self._slots.acquire(blocking=False):
                client.close()
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            with client, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
                try:
                    upstream.connect(self.target)
                except OSError:
                    return
                pump(client, upstream)
        finally:
            self._slots.release()

    def close(self) -> None:
        """Stop accepting (connections in progress finish)."""
        self.listener.close()


def pump(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both directions ended (an end of file is passed on as a half close)."""
    peers = {a: b, b: a}
    with selectors.DefaultSelector() as selector:
        for sock in peers:
            selector.register(sock, selectors.EVENT_READ)
        open_reads = 2
        while open_reads:
            for key, _ in selector.select():
                source: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = source.recv(CHUNK)
                    if data:
                        peers[source].sendall(data)
                        continue
                    peers[source].shutdown(socket.SHUT_WR)
                except OSError:
                    return
                selector.unregister(source)
                open_reads -= 1
