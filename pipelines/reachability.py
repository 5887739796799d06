"""Is the KFP host there at all? One TCP connection, answered in milliseconds.

``g2rpo pipeline submit``/``schedule`` check this first — before importing the pipeline (kfp and the
reward registry take seconds to import) and before the parameters' checks — so a mistyped host or a
missing port-forward is reported at once. Only a connection is opened and closed: no HTTP request
reaches the server (:func:`pipelines.submit.check_host` then asks its healthz endpoint).
"""

from __future__ import annotations

import re
import socket
import urllib.parse

from g2rpo.errors import G2RPOError, problem

__all__ = ["CONNECT_TIMEOUT_S", "check_reachable"]

CONNECT_TIMEOUT_S = 5.0


def check_reachable(host: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse ``host`` when its port takes no TCP connection within ``timeout`` seconds."""
    if not re.match(r"^https?://", host):
        raise G2RPOError(problem("--host", host, "give the KFP API URL, e.g. http://localhost:8888"))
    url = urllib.parse.urlsplit(host)
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        raise G2RPOError(
            problem("--host", host, "its port is not a number in 0..65535; e.g. http://localhost:8888")
        ) from None
    try:
        socket.create_connection((url.hostname or "", port), timeout=timeout).close()
    except OSError as exc:
        raise G2RPOError(
            problem("--host", host, f"unreachable within {timeout:g} s ({exc}); check the URL or port-forward")
        ) from None
