"""A loopback HTTP server that answers the KFP v2beta1 endpoints ``kfp.Client`` calls, recording each request.

Minimal replies (../shared/notes/STACK.md): healthz, experiments (list empty, create), runs, pipelines/upload,
recurringruns. Tests read ``requests`` to check what the real client sent.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLIES = {
    ("GET", "/apis/v2beta1/healthz"): {"multi_user": False},
    ("GET", "/apis/v2beta1/experiments"): {},
    ("POST", "/apis/v2beta1/experiments"): {"experiment_id": "e1", "display_name": "g2rpo"},
    ("POST", "/apis/v2beta1/runs"): {"run_id": "r1", "experiment_id": "e1"},
    ("POST", "/apis/v2beta1/pipelines/upload"): {"pipeline_id": "p1"},
    ("POST", "/apis/v2beta1/recurringruns"): {"recurring_run_id": "rr1"},
}


class KfpServer:
    def __init__(self):
        self.requests: list[tuple[str, str, bytes]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?", 1)[0]
                server.requests.append((method, self.path, body))
                reply = REPLIES.get((method, path))
                data = json.dumps(reply if reply is not None else {"error": "not found"}).encode()
                self.send_response(200 if reply is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 (http.server's name)
                self._reply("GET")

            def do_POST(self):  # noqa: N802
                self._reply("POST")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> KfpServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def bodies(self, method: str, path: str) -> list[dict]:
        return [json.loads(body) for m, p, body in self.requests if m == method and p.split("?")[0] == path]
