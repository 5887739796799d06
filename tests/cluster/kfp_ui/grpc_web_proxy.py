#!/usr/bin/env python3
"""grpc_web_proxy.py: a minimal grpc-web -> gRPC proxy (a stand-in for Envoy's grpc_web filter).

WHAT  Accepts grpc-web unary calls over HTTP/1.1 (POST /<package.Service>/<Method>) and forwards each as a plain
      gRPC unary call to an upstream gRPC server, passing the protobuf bytes through untouched (no .proto
      needed: grpcio generic unary_unary with identity serializers). Written for the Kubeflow Pipelines UI,
      whose browser code and Node server talk grpc-web to ML Metadata (normally through Envoy
      `metadata-envoy-service:9090`) while MLMD itself speaks plain gRPC (`metadata-grpc-service:8080`).
      Content types: application/grpc-web-text (base64 body, base64 reply) and application/grpc-web,
      application/grpc-web+proto (binary). Reply body = data frame (flag 0x00) + trailer frame (flag 0x80)
      carrying "grpc-status:N\\r\\ngrpc-message:...\\r\\n" (+ any trailing metadata); a failed call gets only
      the trailer frame, with the gRPC status code of the upstream error. CORS: OPTIONS preflight answered
      with permissive headers (x-grpc-web, x-user-agent, content-type, grpc-timeout, ...), and every reply
      carries Access-Control-Allow-Origin and exposes grpc-status / grpc-message.
      Not supported: streaming RPCs (MLMD has none that the UI uses), compressed frames (flag 0x01).
HOW   python3 grpc_web_proxy.py --listen 127.0.0.1:9090 --upstream HOST:8080 [--verbose]
      needs only `grpcio` (pip install grpcio). Then point the KFP UI server at it:
      METADATA_ENVOY_SERVICE_SERVICE_HOST=127.0.0.1 METADATA_ENVOY_SERVICE_SERVICE_PORT=9090
"""

import argparse
import base64
import binascii
import logging
import re
import struct
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc

GRPC_WEB_TEXT = "application/grpc-web-text"
GRPC_WEB_BIN = "application/grpc-web+proto"
ALLOWED_TYPES = (GRPC_WEB_TEXT, "application/grpc-web-text+proto", "application/grpc-web", GRPC_WEB_BIN)
CORS_ALLOW_HEADERS = (
    "keep-alive,user-agent,cache-control,content-type,content-transfer-encoding,"
    "custom-header-1,x-accept-content-transfer-encoding,x-accept-response-streaming,"
    "x-user-agent,x-grpc-web,grpc-timeout,authorization"
)
CORS_EXPOSE_HEADERS = "grpc-status,grpc-message,grpc-status-details-bin,custom-header-1"
# request headers that are HTTP/grpc-web plumbing, not gRPC metadata worth forwarding
SKIP_HEADERS = {
    "host",
    "connection",
    "keep-alive",
    "content-type",
    "content-length",
    "accept",
    "accept-encoding",
    "accept-language",
    "user-agent",
    "x-user-agent",
    "x-grpc-web",
    "grpc-timeout",
    "origin",
    "referer",
    "te",
    "transfer-encoding",
    "upgrade",
    "cookie",
    "cache-control",
    "pragma",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-port",
    "x-real-ip",
    "sec-fetch-site",
    "sec-fetch-mode",
    "sec-fetch-dest",
    "sec-ch-ua",
    "sec-ch-ua-mobile",
    "sec-ch-ua-platform",
    "dnt",
    "x-accept-content-transfer-encoding",
    "x-accept-response-streaming",
    "content-transfer-encoding",
    "proxy-connection",
    "expect",
}
METADATA_KEY = re.compile(r"^[0-9a-z_.\-]+$")
PATH_RE = re.compile(r"^/[A-Za-z_][\w.]*/[A-Za-z_]\w*$")
TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def frame(flag: int, payload: bytes) -> bytes:
    """One grpc-web frame: 1 flag byte, 4-byte big-endian length, payload."""
    return struct.pack(">BI", flag, len(payload)) + payload


def parse_frames(body: bytes):
    """Split a grpc-web body into (flag, payload) frames; raises ValueError on a malformed body."""
    frames, i = [], 0
    while i < len(body):
        if len(body) - i < 5:
            raise ValueError(f"truncated frame header at byte {i}")
        flag, length = struct.unpack(">BI", body[i : i + 5])
        i += 5
        if len(body) - i < length:
            raise ValueError(f"frame declares {length} bytes, {len(body) - i} present")
        frames.append((flag, body[i : i + length]))
        i += length
    return frames


def decode_text_body(raw: bytes) -> bytes:
    """grpc-web-text: the body is base64; a client may send several padded base64 chunks back to back."""
    raw = b"".join(raw.split())  # drop any whitespace/newlines
    out, i = [], 0
    while i < len(raw):
        j = raw.find(b"=", i)
        if j == -1:
            chunk, i = raw[i:], len(raw)
        else:
            k = j
            while k < len(raw) and raw[k : k + 1] == b"=":
                k += 1
            chunk, i = raw[i:k], k
        out.append(base64.b64decode(chunk + b"=" * (-len(chunk) % 4), validate=False))
    return b"".join(out)


def parse_timeout(value):
    m = re.fullmatch(r"(\d{1,8})([HMSmun])", value or "")
    return int(m.group(1)) * TIMEOUT_UNITS[m.group(2)] if m else None


def percent_encode(message: str) -> str:
    """gRPC's rule for grpc-message: UTF-8, then %XX for bytes outside 0x20-0x7E and for '%' itself."""
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in message.encode())


def trailer_block(code: int, message: str, trailing_metadata=()) -> bytes:
    lines = [f"grpc-status:{code}", f"grpc-message:{percent_encode(message or '')}"]
    for key, value in trailing_metadata or ():
        if key.endswith("-bin") and isinstance(value, (bytes, bytearray)):
            value = base64.b64encode(value).decode()
        elif isinstance(value, (bytes, bytearray)):
            value = value.decode("latin-1")
        lines.append(f"{key}:{value}")
    return ("\r\n".join(lines) + "\r\n").encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "grpcweb-proxy/1.0"
    channel: grpc.Channel = None  # set in main()
    default_timeout = None
    verbose = False

    def log_message(self, fmt, *args):  # route http.server's access log through logging
        if self.verbose:
            logging.info("%s %s", self.address_string(), fmt % args)

    def _cors(self):
        origin = self.headers.get("Origin")
        self.send_header("Access-Control-Allow-Origin", origin or "*")
        if origin:
            self.send_header("Vary", "Origin")
            self.send_header("Access-Control-Allow-Credentials", "true")
        self.send_header("Access-Control-Expose-Headers", CORS_EXPOSE_HEADERS)

    def _plain(self, status: int, text: str):
        body = text.encode()
        self.send_response(status)
        self._cors()
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_OPTIONS(self):
        self.send_response(204)
        self._cors()
        self.send_header("Access-Control-Allow-Methods", "POST, GET, OPTIONS, PUT, DELETE")
        req_headers = self.headers.get("Access-Control-Request-Headers")
        self.send_header(
            "Access-Control-Allow-Headers", CORS_ALLOW_HEADERS + ("," + req_headers if req_headers else "")
        )
        self.send_header("Access-Control-Max-Age", "1728000")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        if self.path in ("/healthz", "/"):
            return self._plain(200, "ok\n")
        return self._plain(405, "grpc-web proxy: use POST\n")

    def do_POST(self):
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = self._read_chunked()
        if ctype not in ALLOWED_TYPES:
            return self._plain(415, f"unsupported content-type {ctype!r}; want one of {ALLOWED_TYPES}\n")
        is_text = ctype.startswith(GRPC_WEB_TEXT)
        path = urllib.parse.urlsplit(self.path).path
        if not PATH_RE.match(path):
            return self._reply(is_text, ctype, None, grpc.StatusCode.UNIMPLEMENTED.value[0], f"bad method path {path}")
        try:
            body = decode_text_body(raw) if is_text else raw
            frames = parse_frames(body)
            data = [p for f, p in frames if not f & 0x80]
            if any(f & 0x01 for f, _ in frames):
                raise ValueError("compressed grpc-web frames are not supported")
            if len(data) != 1:
                raise ValueError(f"expected exactly one data frame for a unary call, got {len(data)}")
        except (ValueError, binascii.Error) as e:
            return self._reply(is_text, ctype, None, grpc.StatusCode.INTERNAL.value[0], f"grpc-web request: {e}")

        metadata = []
        for key, value in self.headers.items():
            k = key.lower()
            if k in SKIP_HEADERS or k.startswith(("grpc-", "access-control-", "sec-")) or not METADATA_KEY.match(k):
                continue
            metadata.append((k, value))
        timeout = parse_timeout(self.headers.get("grpc-timeout")) or self.default_timeout

        call = self.channel.unary_unary(path, request_serializer=None, response_deserializer=None)
        try:
            response, rpc = call.with_call(data[0], timeout=timeout, metadata=metadata or None)
            code, message, trailing = 0, "", rpc.trailing_metadata()
        except grpc.RpcError as e:
            response = None
            code = e.code().value[0] if e.code() else grpc.StatusCode.UNKNOWN.value[0]
            message = e.details() or ""
            trailing = e.trailing_metadata() if hasattr(e, "trailing_metadata") else ()
        if self.verbose:
            logging.info(
                "%s -> grpc-status %d %s (%s, %d bytes in, %s bytes out)",
                path,
                code,
                message,
                "text" if is_text else "binary",
                len(data[0]),
                len(response) if response is not None else "-",
            )
        self._reply(is_text, ctype, response, code, message, trailing)

    def _read_chunked(self) -> bytes:
        out = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(out)
            out.append(self.rfile.read(size))
            self.rfile.readline()

    def _reply(self, is_text, ctype, response, code, message, trailing=()):
        body = b""
        if response is not None:
            body += frame(0x00, response)
        body += frame(0x80, trailer_block(code, message, trailing))
        if is_text:
            body = base64.b64encode(body)
        self.send_response(200)
        self._cors()
        self.send_header(
            "Content-Type",
            GRPC_WEB_TEXT if is_text else (ctype if ctype != "application/grpc-web" else "application/grpc-web+proto"),
        )
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--listen", default="127.0.0.1:9090", help="HOST:PORT to serve grpc-web on (default 127.0.0.1:9090)"
    )
    ap.add_argument("--upstream", default="127.0.0.1:8080", help="plain gRPC server HOST:PORT (default 127.0.0.1:8080)")
    ap.add_argument("--timeout", type=float, default=60.0, help="default per-call deadline in s (default 60)")
    ap.add_argument("--verbose", action="store_true", help="log every call")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    host, _, port = args.listen.rpartition(":")
    Handler.channel = grpc.insecure_channel(
        args.upstream,
        options=[("grpc.max_receive_message_length", 100 << 20), ("grpc.max_send_message_length", 100 << 20)],
    )
    Handler.default_timeout = args.timeout
    Handler.verbose = args.verbose
    server = ThreadingHTTPServer((host.strip("[]") or "0.0.0.0", int(port)), Handler)
    server.daemon_threads = True
    logging.info("grpc-web proxy on http://%s:%d -> gRPC %s", *server.server_address[:2], args.upstream)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        Handler.channel.close()


if __name__ == "__main__":
    sys.exit(main())
