"""A loopback HTTP server that answers the KFP v2beta1 endpoints ``kfp.Client`` calls, recording each request.

Minimal replies, as the real ``kfp.Client`` 2.17.3 was measured to need them: healthz, experiments (list empty, create), runs, pipelines/upload.
Recurring runs behave as a KFP 2.17 API server was observed to: every create makes a new one (no check that
the name is unused), listed per experiment and filtered by display name (case-insensitively), disabled and
deleted by id; a display name longer than :data:`DISPLAY_NAME_COLUMN` characters is answered with HTTP 500
and MySQL's "Data too long" message. ``fail`` makes an endpoint answer an error, as a broken server would.
Tests read ``requests`` to check what the real client sent (the healthz probes apart, in ``probes``).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from g2rpo.commands.reachability import HEALTHZ

REPLIES = {
    ("GET", HEALTHZ): {"multi_user": False},
    ("GET", "/apis/v2beta1/experiments"): {},
    ("POST", "/apis/v2beta1/experiments"): {"experiment_id": "e1", "display_name": "g2rpo"},
    ("POST", "/apis/v2beta1/runs"): {"run_id": "r1", "experiment_id": "e1"},
    ("POST", "/apis/v2beta1/pipelines/upload"): {"pipeline_id": "p1"},
}
RECURRING = "/apis/v2beta1/recurringruns"
# What the observed server stored display names in: a longer one fails after the ScheduledWorkflow exists.
DISPLAY_NAME_COLUMN = 255


class KfpServer:
    def __init__(self):
        # Every request but the health probes: a GET of healthz changes nothing, and submit/schedule send
        # one before any check (g2rpo/commands/reachability.py: a hung host is refused before the pipeline's
        # imports), so "nothing was sent" means nothing here.
        self.requests: list[tuple[str, str, bytes]] = []
        self.probes: list[str] = []  # the paths of the healthz GETs
        self.recurring: dict[str, dict] = {}  # id -> the recurring run as the server holds it
        self.fail: dict[tuple[str, str], tuple[int, dict]] = {}  # (method, path) -> (status, body)
        self._lock = threading.Lock()
        self._created = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path, _, query = self.path.partition("?")
                if (method, path) == ("GET", HEALTHZ):
                    server.probes.append(self.path)
                else:
                    server.requests.append((method, self.path, body))
                with server._lock:
                    status, reply = server._answer(method, path, urllib.parse.parse_qs(query), body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 (http.server's name)
                self._reply("GET")

            def do_POST(self):  # noqa: N802
                self._reply("POST")

            def do_DELETE(self):  # noqa: N802
                self._reply("DELETE")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def _answer(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> tuple[int, dict]:
        if (method, path) in self.fail:
            return self.fail[(method, path)]
        if (method, path) in REPLIES:
            return 200, REPLIES[(method, path)]
        if path == RECURRING and method == "POST":
            return self._create_recurring(json.loads(body))
        if path == RECURRING and method == "GET":
            return 200, self._list_recurring(query)
        run_id, _, verb = path.removeprefix(RECURRING + "/").partition(":")
        if path.startswith(RECURRING + "/") and run_id in self.recurring:
            if method == "POST" and verb == "disable":
                self.recurring[run_id] = {**self.recurring[run_id], "status": "DISABLED", "mode": "DISABLE"}
                return 200, {}
            if method == "DELETE" and not verb:
                del self.recurring[run_id]
                return 200, {}
            if method == "GET" and not verb:
                return 200, self.recurring[run_id]
        return 404, {"error": "not found", "code": 5, "message": "not found"}

    def _create_recurring(self, request: dict) -> tuple[int, dict]:
        name = request.get("display_name", "")
        if len(name) > DISPLAY_NAME_COLUMN:
            message = (
                "Internal error: Failed to create a recurring run: Error 1406 (22001): Data too long for column "
                "'DisplayName' at row 1"
            )
            return 500, {"error": message, "code": 13, "message": message}
        self._created += 1
        run_id = f"rr{self._created}"
        stored = {**request, "recurring_run_id": run_id, "status": "ENABLED", "created_at": "2026-12-01T00:00:00Z"}
        self.recurring[run_id] = stored
        return 200, stored

    def _list_recurring(self, query: dict[str, list[str]]) -> dict:
        runs = list(self.recurring.values())
        if "experiment_id" in query:
            runs = [r for r in runs if r.get("experiment_id") == query["experiment_id"][0]]
        for predicate in json.loads(query["filter"][0]).get("predicates", []) if "filter" in query else []:
            if predicate.get("key") == "display_name" and predicate.get("operation") == "EQUALS":
                wanted = predicate.get("stringValue", predicate.get("string_value", "")).lower()
                runs = [r for r in runs if r.get("display_name", "").lower() == wanted]
        return {"recurringRuns": runs, "total_size": len(runs)} if runs else {}

    def __enter__(self) -> KfpServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def bodies(self, method: str, path: str) -> list[dict]:
        return [json.loads(body) for m, p, body in self.requests if m == method and p.split("?")[0] == path]
