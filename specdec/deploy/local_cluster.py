"""The Ray head that `make deploy` starts when no cluster is named, and the one a KubeRay head pod runs.

`ray start --head --block` as a child of ours: it stops its whole cluster on SIGTERM, so stopping it
is one signal to one process id we recorded, never a search by name (`ray stop` would also end other
Ray clusters of the same user on the machine). Locally it runs detached (its own session) and the
state file (`~/.cache/specdec/deploy/<name>.json`: pid, address, log) lets `undeploy` find it again.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from specdec.errors import Unavailable
from specdec.parallel import free_port
from specdec.serving_config import StackConfig

STARTED_LINE = "Ray runtime started"
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0


def state_file(name: str, state_dir: str | None = None) -> Path:
    root = Path(state_dir) if state_dir else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdec" / "deploy"
    return root / f"{name}.json"


def read_state(path: Path) -> dict | None:
    """The recorded head if its process still runs (a stale file is removed)."""
    try:
        state = json.loads(path.read_text())
        pid = int(state["pid"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError, KeyError):
        path.unlink(missing_ok=True)
        return None
    if "ray" not in cmdline or "start" not in cmdline:  # the pid was reused by something else
        path.unlink(missing_ok=True)
        return None
    return state


def head_command(stack: StackConfig, port: int) -> list[str]:
    """One node on 127.0.0.1 offering every custom resource the stack needs and the CPUs its processes
    ask for (Ray's CPUs are a count for placement, not a limit), no dashboard, a small object store."""
    from specdec.deploy.ray_stack import deploy_config, needed_resources

    config = deploy_config(stack)
    cpus = (config.router.num_cpus + len(stack.drafts) * config.drafts.num_cpus
            + sum(t.tp for t in stack.targets) * config.targets.num_cpus)
    return [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
            "--port", str(port), "--num-cpus", str(max(os.cpu_count() or 1, math.ceil(cpus))),
            "--resources", json.dumps(needed_resources(stack)), "--include-dashboard", "false",
            "--object-store-memory", str(config.object_store_mb << 20), "--disable-usage-stats"]


def wait_started(popen: subprocess.Popen, lines, timeout_s: float = START_TIMEOUT_S) -> None:
    """Read `lines` (the head's output) until Ray says it started; raise with the output if it ends first."""
    seen: list[str] = []
    done = threading.Event()

    def read() -> None:
        for line in lines:
            seen.append(line)
            if STARTED_LINE in line:
                done.set()
        done.set()

    threading.Thread(target=read, daemon=True).start()
    if not done.wait(timeout_s) or STARTED_LINE not in "".join(seen):
        popen.terminate()
        raise Unavailable(f"the Ray head did not start:\n{''.join(seen[-20:])}")


def follow(path: Path, popen: subprocess.Popen):
    """The lines of a growing log file while its writer runs."""
    with open(path) as log:
        while True:
            line = log.readline()
            if line:
                yield line
            elif popen.poll() is not None:
                return
            else:
                time.sleep(0.1)


def start_local(stack: StackConfig, path: Path, echo=print) -> str:
    """Start a detached head on 127.0.0.1, record it in `path`, return its address."""
    port = free_port()
    path.parent.mkdir(parents=True, exist_ok=True)
    log_path = path.with_suffix(".log")
    # Ray replaces a loopback --node-ip-address by the machine's outward IP unless told it runs on one machine;
    # its GCS gets 120 s rather than 30 s to come up (a busy 2-core machine has missed 30 s)
    env = {"RAY_gcs_server_port_wait_time_s": "120", **os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    with open(log_path, "w") as log:
        popen = subprocess.Popen(head_command(stack, port), stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    wait_started(popen, follow(log_path, popen))
    address = f"127.0.0.1:{port}"
    path.write_text(json.dumps({"pid": popen.pid, "address": address, "log": str(log_path)}))
    echo(f"started a local Ray cluster on {address} (pid {popen.pid}, log {log_path})")
    return address


def stop_local(path: Path, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """SIGTERM to the recorded head (it stops its cluster); SIGKILL to its session if it lingers."""
    state = read_state(path)
    if state is None:
        return False
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not _gone(pid):
        os.killpg(pid, signal.SIGKILL)  # its own session: only what it started
    path.unlink(missing_ok=True)
    return True


def _gone(pid: int) -> bool:
    """Exited: reaped, or a zombie its (adoptive) parent has not reaped yet."""
    try:  # reap it if it is our child (started by this process)
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def run_head(command: str, echo=print) -> subprocess.Popen:
    """A head started by a given shell command (KubeRay's generated `ray start ... --block`), as our child
    with its output passed through; returns once Ray runs."""
    popen = subprocess.Popen(["/bin/bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def lines():
        for line in popen.stdout:
            echo(line.rstrip("\n"))
            yield line

    wait_started(popen, lines())
    return popen
