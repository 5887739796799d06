"""Real Prometheus and Pushgateway servers on loopback for the observability tests.

Debian's ``prometheus`` (2.42) and ``prometheus-pushgateway`` (1.5), installed by ``make install``.
Prometheus scrapes every second: the Pushgateway (``honor_labels``:
the pushed ``job`` and ``pipeline`` are kept) and the training exporter's port, chosen here before
the run starts (scrapes fail until the exporter listens; :meth:`Servers.start` returns once the scrape loop runs). It also loads the chart's alert rules,
so every rule is evaluated by the real server. The gateway keeps no persistence file, so no series
from an earlier session leak in. Both run in their own process groups and are stopped by PID.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.s3server import free_ports

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts" / "g2rpo" / "rules" / "g2rpo-rules.yaml"
SCRAPE_JOB = "g2rpo-training"


def binaries() -> dict[str, str | None]:
    return {name: shutil.which(name) for name in ("prometheus", "prometheus-pushgateway", "promtool")}


class PromQLError(RuntimeError):
    """Prometheus refused a query (bad syntax, unknown function)."""


@dataclass
class Servers:
    """A Prometheus scraping a Pushgateway and one exporter port, with the chart's rules loaded."""

    workdir: Path
    prometheus_port: int
    gateway_port: int
    exporter_port: int
    # Where the Pushgateway listens and is scraped: loopback, or an address pods reach (the cluster tier's link).
    gateway_host: str = "127.0.0.1"
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def gateway_url(self) -> str:
        return f"http://{self.gateway_host}:{self.gateway_port}"

    def start(self, timeout_s: float = 30.0) -> Servers:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": "pushgateway",
                    "honor_labels": True,
                    "static_configs": [{"targets": [f"{self.gateway_host}:{self.gateway_port}"]}],
                },
                {"job_name": SCRAPE_JOB, "static_configs": [{"targets": [f"127.0.0.1:{self.exporter_port}"]}]},
            ],
        }
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        self._spawn(
            "pushgateway",
            [
                "prometheus-pushgateway",
                f"--web.listen-address={self.gateway_host}:{self.gateway_port}",
                "--persistence.file=",
            ],
        )
        self._spawn(
            "prometheus",
            [
                "prometheus",
                f"--config.file={config_file}",
                f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
                f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            ],
        )
        for url in (f"{self.gateway_url}/-/ready", f"{self.prometheus_url}/-/ready"):
            self._wait_ready(url, timeout_s)
        # Static targets are first scraped a few seconds after start-up: wait for it once, so that a
        # short training run that starts next is scraped from its first second.
        if not self.wait_for('up{job="pushgateway"} == 1', timeout_s):
            raise RuntimeError(f"Prometheus never scraped the Pushgateway: {self.logs()}")
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.workdir / f"{name}.log").open("wb")
        self.processes.append(
            subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.workdir)
        )

    def _wait_ready(self, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.processes):
                raise RuntimeError(f"a server exited early; logs in {self.workdir}: {self.logs()}")
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{url} not ready after {timeout_s}s: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(self.workdir.glob("*.log")))

    def stop(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.processes:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.processes.clear()

    # ------------------------------------------------------------------ the HTTP API

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.prometheus_url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # 400/422: the expression itself is wrong
            body = json.loads(exc.read())
            raise PromQLError(f"{params.get('query', path)!r}: {body.get('error')}") from None
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]

    def query_range(self, expr: str, seconds: float = 600, step: float = 1) -> list[dict[str, Any]]:
        """What a Grafana panel asks for: ``expr`` over the last ``seconds``."""
        end = time.time()
        return self.api("query_range", query=expr, start=end - seconds, end=end, step=step)["result"]

    def wait_for(self, expr: str, timeout_s: float = 30.0, seconds: float = 600) -> list[dict[str, Any]]:
        """Poll a range query until it returns data (new targets and pushes take a scrape or two)."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query_range(expr, seconds)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.5)


def start_servers(workdir: Path) -> Servers:
    prometheus_port, gateway_port, exporter_port = free_ports(3)
    workdir.mkdir(parents=True, exist_ok=True)
    return Servers(workdir, prometheus_port, gateway_port, exporter_port).start()


# --------------------------------------------------------------------------- checking queries

METRIC_NAME = re.compile(r"\b((?:g2rpo|process)_[a-z0-9_]+)\b")
# Series only a CUDA device produces: on CPU their queries may be empty, but their names must be ones
# the exporter defines (checked by the test), so a misspelling still fails.
CUDA_ONLY = {"g2rpo_training_accelerator_memory_bytes"}


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel."""
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]


def substitute(expr: str, variables: dict[str, str], rate_interval: str = "1m") -> str:
    """What Grafana sends: template variables replaced (``$__rate_interval`` by ``rate_interval``)."""
    expr = expr.replace("$__rate_interval", rate_interval)
    for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(f"${name}", value)
    return expr


def query_problems(
    servers: Servers, queries: list[tuple[str, str]], *, allow_empty: set[str] = frozenset()
) -> list[str]:
    """Each query run as a panel would (a range query over the last 10 minutes): one line per query
    that Prometheus refuses or that returns no data (unless every metric it names is in ``allow_empty``)."""
    problems = []
    for title, expr in queries:
        try:
            result = servers.query_range(expr)
        except PromQLError as exc:
            problems.append(f"{title}: error {exc}")
            continue
        names = set(METRIC_NAME.findall(expr))
        if not result and not (names and names <= allow_empty):
            problems.append(f"{title}: no data for {expr!r}")
    return problems


def metric_name_problems(servers: Servers, exprs: list[str], *, allow_empty: set[str] = frozenset()) -> list[str]:
    """Every metric an expression names must have had a series in the last 10 minutes (an alert's
    comparison is usually false, so its whole expression returns nothing when all is well)."""
    problems = []
    for expr in exprs:
        for name in sorted(set(METRIC_NAME.findall(expr)) - allow_empty):
            if not servers.query_range(f'count({{__name__="{name}"}})'):
                problems.append(f"{name} (in {expr.strip()!r}): no such series")
    return problems
