"""The cluster's missing DNS: a small responder for the names a TrainJob's pods look each other up by.

``../shared/tools/cluster`` runs no CoreDNS (its README: pods reach the API server by IP). A multi-node
TrainJob needs one name resolved: torchrun on every node connects to ``PET_MASTER_ADDR``, which the Trainer's
torch plugin sets to node 0's pod by its JobSet name (``<job>-node-0-0.<job>``: the pod's ``hostname`` and
``subdomain``, a headless Service). This responder answers, from the API server's live pod and Service lists,
exactly what CoreDNS's ``kubernetes`` plugin answers for those:

- ``<hostname>.<subdomain>.<namespace>.svc.cluster.local`` → the IP of the running pod with that
  ``spec.hostname`` and ``spec.subdomain`` (a replaced pod's new IP as soon as it has one);
- ``<service>.<namespace>.svc.cluster.local`` → the Service's cluster IP;

A records only (an AAAA query for a known name gets an empty answer, so resolvers do not wait); any other name
is NXDOMAIN (pods here reach nothing outside the host anyway). It listens on UDP port 53 at ``cluster ip``, and
the kubelet's resolver file (``WORKDIR/etc/resolv.conf``, which the cluster script copies from the host at
``up`` and the kubelet reads for every new pod) is rewritten to name it, with the search path and ``ndots``
of a cluster's ``ClusterFirst`` policy. Pods started before that keep the host's resolver (unreachable from
the pod network, as before).
"""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass, field

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tests.cluster.kube import Cluster

DOMAIN = ("svc", "cluster", "local")
TTL_S = 1
NXDOMAIN, NOERROR = 3, 0


def _parse_question(packet: bytes) -> tuple[int, int, list[str], int, int]:
    """(id, flags, labels, qtype, end of the question) of a query with one question."""
    ident, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if qdcount != 1:
        raise ValueError("one question per query")
    labels, pos = [], 12
    while packet[pos]:
        length = packet[pos]
        labels.append(packet[pos + 1 : pos + 1 + length].decode("ascii", "replace").lower())
        pos += 1 + length
    qtype, _qclass = struct.unpack("!HH", packet[pos + 1 : pos + 5])
    return ident, flags, labels, qtype, pos + 5


def answer(packet: bytes, lookup) -> bytes:
    """The response to one query: ``lookup(labels) -> [ip, ...] | None`` (None: no such name)."""
    ident, flags, labels, qtype, end = _parse_question(packet)
    ips = lookup(labels)
    rcode = NXDOMAIN if ips is None else NOERROR
    records = [ip for ip in ips or [] if qtype in (1, 255)]  # A or ANY
    # QR, AA, RD as asked, RA; the question echoed; each answer points at it (0xC00C).
    header = struct.pack("!HHHHHH", ident, 0x8400 | (flags & 0x0100) | 0x0080 | rcode, 1, len(records), 0, 0)
    body = b"".join(struct.pack("!HHHIH", 0xC00C, 1, 1, TTL_S, 4) + socket.inet_aton(ip) for ip in records)
    return header + packet[12:end] + body


@dataclass
class ClusterDNS:
    cluster: Cluster
    host: str
    namespace: str  # the search path's first domain, as ClusterFirst gives a pod of this namespace
    queries: list[str] = field(default_factory=list)
    _sock: socket.socket | None = None
    _thread: threading.Thread | None = None

    def start(self) -> ClusterDNS:
        api_client = k8s_config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        self._core = k8s.CoreV1Api(api_client)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((self.host, 53))
        self._sock.settimeout(0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="cluster-dns", daemon=True)
        self._thread.start()
        resolv = self.cluster.workdir / "etc" / "resolv.conf"
        resolv.write_text(
            f"nameserver {self.host}\nsearch {self.namespace}.svc.cluster.local svc.cluster.local cluster.local\n"
            "options ndots:5\n"
        )
        return self

    def lookup(self, labels: list[str]) -> list[str] | None:
        if tuple(labels[-3:]) == DOMAIN:
            labels = labels[:-3]
        else:
            return None
        if len(labels) == 3:  # hostname.subdomain.namespace
            hostname, subdomain, namespace = labels
            pods = self._core.list_namespaced_pod(namespace).items
            ips = [
                p.status.pod_ip
                for p in pods
                if p.spec.hostname == hostname
                and p.spec.subdomain == subdomain
                and p.status.pod_ip
                and p.metadata.deletion_timestamp is None
                and p.status.phase in ("Pending", "Running")
            ]
            return ips or None
        if len(labels) == 2:  # service.namespace
            name, namespace = labels
            try:
                service = self._core.read_namespaced_service(name, namespace)
            except k8s.ApiException:
                return None
            ip = service.spec.cluster_ip
            return [ip] if ip and ip != "None" else []
        return None

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                packet, peer = self._sock.recvfrom(512)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                _, _, labels, _, _ = _parse_question(packet)
                self.queries.append(".".join(labels))
                self._sock.sendto(answer(packet, self._lookup_logged), peer)
            except (ValueError, IndexError, struct.error, OSError):
                continue  # a malformed query gets no answer; the responder goes on

    def _lookup_logged(self, labels: list[str]) -> list[str] | None:
        try:
            return self.lookup(labels)
        except k8s.ApiException:
            return None

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        self._thread = None
