"""Fixtures of the observability tests: real Prometheus + Pushgateway servers on loopback."""

from __future__ import annotations

import pytest

from tests.observability.promservers import Servers, binaries, start_servers


@pytest.fixture(scope="module")
def prom(tmp_path_factory) -> Servers:
    """A Prometheus (1 s scrapes, the chart's rules loaded) and a Pushgateway, stopped after the module."""
    missing = [name for name, path in binaries().items() if path is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (Debian prometheus, prometheus-pushgateway: `make install`)")
    servers = start_servers(tmp_path_factory.mktemp("prometheus"))
    yield servers
    servers.stop()
