"""A real OpenAI-compatible chat-completions server on localhost for judge tests (stdlib only).

Each POST to /v1/chat/completions takes the next scripted reply; the last one repeats. A reply is
(status, content, delay_s): status 200 sends an OpenAI-shaped body whose message content is `content`,
any other status sends `content` as the error body. Every request is recorded (headers, JSON body);
`answered` counts the replies the server began to send (a delayed one only once its delay is over).
GET /v1/models lists `models` ({"data": [{"id": ...}]}), or answers 404 when `models` is None.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, str, float]


class StubServer:
    def __init__(self, replies: list[Reply], models: list[str] | None = None) -> None:
        self.replies = list(replies)
        self.models = models
        self.requests: list[dict[str, Any]] = []
        self.answered = 0
        self.release = threading.Event()  # set at close so sleeping handlers return at once
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if self.path == "/v1/models" and stub.models is not None:
                    listing = [{"id": m, "object": "model", "owned_by": "stub"} for m in stub.models]
                    status, payload = 200, json.dumps({"object": "list", "data": listing}).encode()
                else:
                    status, payload = 404, b"not found"
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                with stub._lock:
                    stub.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    i = min(len(stub.requests), len(stub.replies)) - 1
                status, content, delay = stub.replies[i]
                if delay:
                    stub.release.wait(delay)
                with stub._lock:
                    stub.answered += 1
                if self.path != "/v1/chat/completions":
                    status, content = 404, "not found"
                if status == 200:
                    msg = {"role": "assistant", "content": content}
                    payload = json.dumps(
                        {
                            "id": "x",
                            "object": "chat.completion",
                            "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                        }
                    ).encode()
                else:
                    payload = content.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
