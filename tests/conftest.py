"""Suite-wide test settings.

- Nothing touches the network: Hugging Face libraries run offline, and any socket connection to
  an address outside loopback fails the test that made it.
- Tiers: unmarked tests are unit/integration tests run by `make test`; `slow`, `parity_env` and
  `gpu` are opt-in (see docs/testing.md).
"""

from __future__ import annotations

import ipaddress
import os
import socket

import pytest

pytest_plugins = ["tests.s3server", "tests.tiny_flux_fixture", "tests.disk_fixtures"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")


class NetworkAccessError(RuntimeError):
    pass


def _is_loopback(address) -> bool:
    if isinstance(address, (str, bytes)) and not isinstance(address, tuple):
        return True  # AF_UNIX path
    host = address[0]
    if isinstance(host, bytes):
        host = host.decode()
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost would need DNS: not allowed


_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _guarded_connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address):
        raise NetworkAccessError(f"test tried to reach {address!r}: tests may only use loopback")
    return _real_connect(self, address)


def _guarded_connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address):
        raise NetworkAccessError(f"test tried to reach {address!r}: tests may only use loopback")
    return _real_connect_ex(self, address)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Fail any connection outside loopback (weights and data must come from local files)."""
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _guarded_connect_ex)
    yield


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch is a hard dependency
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
