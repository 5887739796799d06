"""Is the KFP host there, and does it answer? One TCP connection and one small HTTP request,
answered in milliseconds by a live server.

``g2rpo pipeline submit``/``schedule`` check this first — before importing the pipeline (kfp and the
reward registry take seconds to import) and before the parameters' checks — so a mistyped host, a
missing port-forward or a hung server is reported at once. The request is a GET of the KFP API's
healthz endpoint, the same one :func:`pipelines.submit.check_host` asks; whatever status it answers
counts as an answer here (``check_host`` judges the status). The connection and the answer share one
deadline of ``timeout`` seconds, so a host that takes the connection and then never answers (a hung
API server, a port-forward whose pod is gone) is refused when it ends, as one that takes no
connection is.
"""

from __future__ import annotations

import http.client
import re
import time
import urllib.parse

from g2rpo.errors import G2RPOError, problem

__all__ = ["CONNECT_TIMEOUT_S", "HEALTHZ", "check_reachable"]

CONNECT_TIMEOUT_S = 5.0
HEALTHZ = "/apis/v2beta1/healthz"


def check_reachable(host: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse ``host`` when its port takes no TCP connection, or no HTTP answer to a GET of
    :data:`HEALTHZ` comes back, within ``timeout`` seconds in all."""
    if not re.match(r"^https?://", host):
        raise G2RPOError(problem("--host", host, "give the KFP API URL, e.g. http://localhost:8888"))
    url = urllib.parse.urlsplit(host)
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        raise G2RPOError(
            problem("--host", host, "its port is not a number in 0..65535; e.g. http://localhost:8888")
        ) from None
    deadline = time.monotonic() + timeout
    kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    connection = kind(url.hostname or "", port, timeout=timeout)
    try:
        try:
            connection.connect()
        except OSError as exc:
            raise G2RPOError(
                problem("--host", host, f"unreachable within {timeout:g} s ({exc}); check the URL or port-forward")
            ) from None
        assert connection.sock is not None
        connection.sock.settimeout(max(deadline - time.monotonic(), 0.01))
        path = url.path.rstrip("/") + HEALTHZ
        try:
            connection.request("GET", path)
            connection.getresponse().read()
        except (OSError, http.client.HTTPException) as exc:
            what = "no answer" if isinstance(exc, TimeoutError) else f"a broken answer ({exc})"
            raise G2RPOError(
                problem(
                    "--host",
                    host,
                    f"took the connection but gave {what} to GET {path} within {timeout:g} s: the KFP API "
                    "server (or the port-forward in front of it) is hung or is not an HTTP server; check its "
                    "pod (kubectl -n kubeflow get pods -l app=ml-pipeline) or restart the port-forward",
                )
            ) from None
    finally:
        connection.close()
