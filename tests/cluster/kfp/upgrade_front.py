#!/usr/bin/env python3
"""A front for the kfp tool's watch proxy that passes HTTP Upgrade requests (``pods/exec``) to kube-apiserver.

Why: Argo's workflow-controller reaches the API server only through the tool's ``rv-proxy``, which forwards plain
requests and drops ``Connection: Upgrade``. Argo stops a terminated Workflow's running pods by signalling their
containers through ``pods/exec``; through ``rv-proxy`` that fails ("Upgrade request required") and the pod runs on.
This front listens where the controller's kubeconfig points (the tool's proxy port) and looks at the head of each
new connection: an Upgrade request is sent over TLS straight to the API server, with the same bearer token
``rv-proxy`` uses, and the two sockets are spliced both ways; every other connection is spliced, byte for byte, to
``rv-proxy`` restarted on another port (its watch rewrite unchanged). client-go opens a new connection for each
exec stream, so deciding once per connection is enough.

Standard library only; run inside the cluster's network namespace (``tests/cluster/kfp_backend.py``)::

    python3 upgrade_front.py LISTEN_PORT RV_PROXY_PORT https://APISERVER:6443 CA_FILE TOKEN_FILE
"""

import socket
import ssl
import sys
import threading
import urllib.parse

HEAD_LIMIT = 65536


def splice(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until either side closes; then shut both down."""
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (sink, source):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def read_head(client: socket.socket) -> bytes:
    """The request's bytes up to and including the blank line after its headers (and whatever came with them)."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < HEAD_LIMIT:
        chunk = client.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def with_token(head: bytes, token: str) -> bytes:
    """The request head with any Authorization header replaced by the bearer token."""
    lines, sep, rest = head.partition(b"\r\n\r\n")
    kept = [line for line in lines.split(b"\r\n") if not line.lower().startswith(b"authorization:")]
    kept.append(b"Authorization: Bearer " + token.encode())
    return b"\r\n".join(kept) + sep + rest


def is_upgrade(head: bytes) -> bool:
    headers = head.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]
    return any(line.lower().startswith(b"upgrade:") for line in headers)


def serve(listen_port: int, rv_port: int, upstream: str, ca_file: str, token_file: str) -> None:
    target = urllib.parse.urlsplit(upstream)
    context = ssl.create_default_context(cafile=ca_file)
    context.set_alpn_protocols(["http/1.1"])
    token = open(token_file).read().strip()
    server = socket.create_server(("127.0.0.1", listen_port), reuse_port=False)
    print(f"upgrade_front: 127.0.0.1:{listen_port} -> Upgrade: {upstream}; else 127.0.0.1:{rv_port}", flush=True)

    def handle(client: socket.socket) -> None:
        try:
            head = read_head(client)
            if not head:
                client.close()
                return
            if is_upgrade(head):
                raw = socket.create_connection((target.hostname, target.port or 443))
                other = context.wrap_socket(raw, server_hostname=target.hostname)
                other.sendall(with_token(head, token))
                print(f"upgrade {head.split(b' ', 2)[1][:160].decode(errors='replace')}", flush=True)
            else:
                other = socket.create_connection(("127.0.0.1", rv_port))
                other.sendall(head)
        except OSError as exc:
            print(f"upgrade_front: {exc!r}", flush=True)
            client.close()
            return
        threading.Thread(target=splice, args=(other, client), daemon=True).start()
        splice(client, other)

    while True:
        client, _ = server.accept()
        threading.Thread(target=handle, args=(client,), daemon=True).start()


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit("usage: upgrade_front.py LISTEN_PORT RV_PROXY_PORT UPSTREAM_URL CA_FILE TOKEN_FILE")
    serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
