"""An ASGI app served by uvicorn in a background thread, for servers the rollout side runs itself.

The listening socket is made here with a deep accept queue (LISTEN_BACKLOG; the kernel caps it at
net.core.somaxconn): hundreds of agents that connect at once are queued by the kernel, not reset.
Connections are kept alive between calls (KEEP_ALIVE_S), so an agent's next call reuses its
connection instead of opening a new one.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

LISTEN_BACKLOG = 4096
KEEP_ALIVE_S = 75  # longer than agents usually think between two calls
SHUTDOWN_GRACE_S = 5  # requests still running at close get this long, then are cancelled
START_TIMEOUT_S = 30


def listening_socket(host: str, port: int, backlog: int = LISTEN_BACKLOG) -> socket.socket:
    """A TCP socket bound to host:port (0: a free port) and listening with `backlog`."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    return sock


class ThreadedServer:
    """Serve `app` on host:port from a daemon thread; `close()` stops it."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, name: str = "asgi-server") -> None:
        import uvicorn

        self.sock = listening_socket(host, port)
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,  # leave the process's logging configuration alone
            log_level="warning",
            access_log=False,
            backlog=LISTEN_BACKLOG,  # asyncio listens on the socket again with this backlog
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, name=name)
        self.thread.daemon = True
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.sock.close()
                raise RuntimeError(f"{name}: the HTTP server on {host}:{port} did not start")
            time.sleep(0.005)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=SHUTDOWN_GRACE_S + 5)
        self.sock.close()
