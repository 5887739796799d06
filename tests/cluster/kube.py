"""The one-node Kubernetes of ``../shared/tools/cluster`` driven from Python: up, kubectl, load-image, down.

Every call goes through the folder's own ``cluster`` script (its README); nothing here starts a Kubernetes
component itself. :meth:`Cluster.down` always runs (the fixtures call it in ``finally``), and
:func:`host_snapshot` / :func:`leftovers` say what a cluster left behind on the host.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.shared_checkout import shared_path

CLUSTER_DIR = shared_path("tools/cluster")
CLUSTER = CLUSTER_DIR / "cluster"
CRDS = shared_path("crds")


@dataclass
class Cluster:
    """One cluster in ``workdir`` (the script's WORKDIR: its binaries, state and logs)."""

    workdir: Path

    def _run(self, *args: str, timeout: float = 300, check: bool = True, input: str | None = None):
        done = subprocess.run([str(CLUSTER), *args], capture_output=True, text=True, timeout=timeout, input=input)
        if check and done.returncode != 0:
            raise RuntimeError(
                f"cluster {' '.join(args[:3])} exited {done.returncode}:\n{done.stderr[-3000:]}{done.stdout[-2000:]}"
                f"\n(logs: {self.workdir / 'logs'})"
            )
        return done

    def up(self) -> float:
        start = time.monotonic()
        self._run("up", str(self.workdir), timeout=600)
        return time.monotonic() - start

    def down(self) -> float:
        start = time.monotonic()
        self._run("down", str(self.workdir), timeout=600, check=False)
        return time.monotonic() - start

    def ip(self) -> str:
        return self._run("ip", str(self.workdir)).stdout.strip()

    def load_image(self, *images: str) -> float:
        start = time.monotonic()
        self._run("load-image", str(self.workdir), *images, timeout=1800)
        return time.monotonic() - start

    def trainer_up(self) -> float:
        start = time.monotonic()
        self._run("trainer-up", str(self.workdir), str(CRDS), timeout=600)
        return time.monotonic() - start

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 300):
        return self._run("kubectl", str(self.workdir), *args, input=input, check=check, timeout=timeout)

    def apply(self, manifest: str, *args: str) -> str:
        """``kubectl apply --server-side`` of a YAML/JSON stream; returns kubectl's output."""
        return self.kubectl(
            "apply", "--server-side", "--field-manager=g2rpo-cluster-test", *args, "-f", "-", input=manifest
        ).stdout

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict:
        ns = ["-n", namespace] if namespace else []
        return json.loads(self.kubectl("get", kind, name, *ns, "-o", "json").stdout)

    def wait_pod_done(self, name: str, namespace: str, timeout_s: float) -> str:
        """Poll until the pod ends; returns its phase (``Succeeded`` / ``Failed``), or raises at the deadline
        with its status."""
        deadline = time.monotonic() + timeout_s
        pod: dict = {}
        while time.monotonic() < deadline:
            pod = self.get("pod", name, namespace)
            phase = pod.get("status", {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                return phase
            time.sleep(2)
        raise TimeoutError(
            f"pod {namespace}/{name} not finished after {timeout_s:.0f} s: {json.dumps(pod.get('status'))[:2000]}"
        )

    def logs(self, name: str, namespace: str, container: str | None = None) -> str:
        extra = ["-c", container] if container else []
        return self.kubectl("logs", name, "-n", namespace, *extra, check=False).stdout


def host_snapshot(workdir: Path) -> dict[str, list[str]]:
    """What a cluster in ``workdir`` may leave on the host (its README): its veth (``kc<hash>``), mounts under
    ``workdir``, ``/var/lib/cni`` or ``/run/netns``, the ``kubepods`` cgroups, network namespaces. Only those:
    other sessions on the machine mount and link things of their own meanwhile."""

    def lines(*cmd: str) -> list[str]:
        return sorted(subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines())

    links = [line.split(":")[1].strip().split("@")[0] for line in lines("ip", "-o", "link", "show") if ":" in line]
    ours = (str(workdir), "/var/lib/cni", "/run/netns")
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    cgroups = [str(p) for p in Path("/sys/fs/cgroup").glob("*/kubepods")] + [
        str(p) for p in Path("/sys/fs/cgroup").glob("kubepods")
    ]
    return {
        "links": sorted(link for link in links if link.startswith("kc")),
        "mounts": sorted(m for m in mounts if m.startswith(ours)),
        "cgroups": sorted(cgroups),
        "netns": lines("ip", "netns", "list"),
    }


def leftovers(before: dict[str, list[str]], after: dict[str, list[str]]) -> dict[str, list[str]]:
    """What ``after`` holds that ``before`` did not (empty when a cluster left nothing behind)."""
    return {key: sorted(set(after[key]) - set(before[key])) for key in before if set(after[key]) - set(before[key])}


def processes_naming(path: Path) -> list[str]:
    """Command lines of running processes that name ``path`` (a cluster's WORKDIR): none once it is down."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in cmdline and proc.name != str(os.getpid()):
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def stop_process_group(process: subprocess.Popen[bytes] | None, timeout: float = 20) -> None:
    """End a server started in its own process group: SIGTERM, then SIGKILL if it outlives ``timeout``."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=timeout)
