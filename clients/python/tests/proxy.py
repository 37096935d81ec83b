"""A TCP proxy on 127.0.0.1 that a test controls: cut every proxied connection (RST), or hold
back what the server sends, to lose answers on purpose."""

from __future__ import annotations

import socket
import struct
import threading


class Proxy:
    """Forwards 127.0.0.1:<port> to ``target`` ("host:port")."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.hold_back = threading.Event()  # set: server -> client bytes are dropped
        self.accepted = 0
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server))
                self.accepted += 1
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if from_server and self.hold_back.is_set():
                    continue
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Reset every proxied connection (both directions); new ones are accepted again."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        self.hold_back.clear()
        for pair in pairs:
            for s in pair:
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        self.cut()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
