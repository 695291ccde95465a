"""The Ray actors of a deployment: each owns one serving process, the same `specdec serve <kind>` that
`specdec serve --config` starts (specdec.launch), so a server behaves alike however it was started.

Why a process per actor rather than the server inside the actor: the servers own their signals
(SIGTERM drains), threads and torch settings, and a crash of the server is then simply the end of the
actor. The actor ends itself when its process ends (`os._exit`), which Ray reads as a failure and
answers by starting the actor again (`max_restarts`); the new process may get a new port, which the
router actor's discovery publishes to the router (router.discovery's workers file). The process dies
with its actor (PR_SET_PDEATHSIG, set by specdec.launch), so a killed actor leaves no server behind.

A tensor-parallel target is one actor per rank in the target's STRICT_PACK placement group: rank 0
(the named actor, the one the router talks to) creates the followers in the other bundles and owns
them, so they die with it; when any rank ends, rank 0 ends too and Ray restarts the group as one
(the ranks rendezvous again on a fresh port on their shared node).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from specdec import launch

LOOPBACK = ("127.0.0.1", "localhost", "::1")
FAILED_START_BACKOFF_S = 10.0  # a server that cannot start is retried (by Ray) after this long
STOP_MARGIN_S = 10.0  # beyond the server's own drain time before it is killed


def placed_on_node(config, node_ip: str):
    """A server that binds beyond loopback advertises its node's address unless the config names one
    (fields `host` / `advertise_host`, where this version of the config has them)."""
    names = {f.name for f in dataclasses.fields(config)}
    if {"host", "advertise_host"} <= names and not config.advertise_host and config.host not in LOOPBACK:
        return dataclasses.replace(config, advertise_host=node_ip)
    return config


def node_ip(ray) -> str:
    """The address this actor's node registered with (ray.util.get_node_ip_address guesses from the
    routes instead, which on a cluster bound to 127.0.0.1 is the wrong answer)."""
    here = ray.get_runtime_context().get_node_id()
    return next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == here), ray.util.get_node_ip_address())


def drain_timeout_s(config, default: float = 30.0) -> float:
    return float(getattr(config, "drain_timeout_s", None) or default)


class ServerActor:
    """One serving process. Methods may run concurrently (the actor is created with max_concurrency > 1):
    `address` must answer while `ready` waits."""

    def __init__(self, kind: str, config, env: dict, ready_timeout_s: float, rank: int = 0,
                 follower_options: dict | None = None):
        import ray

        self.kind, self.rank, self.ready_timeout_s = kind, rank, ready_timeout_s
        self.node_ip = node_ip(ray)
        self.config = placed_on_node(config, self.node_ip)
        self.env = {k: str(v) for k, v in env.items()}
        self.process: launch.ServerProcess | None = None
        self.address = self.http_address = self.error = ""
        self.started = threading.Event()
        self.stopping = False
        self.followers: list = []
        if kind == "target" and config.tp > 1 and rank == 0:
            self._start_followers(follower_options or {})
        threading.Thread(target=self._keep, name="keep", daemon=True).start()

    # -- the process ---------------------------------------------------------------------------
    def _keep(self) -> None:
        """Start the server, learn its address, and end this actor when the server ends. Runs on its
        own thread for the process's whole life: the process's parent-death signal follows this thread."""
        ready = False
        try:
            self.process = launch.spawn(self.kind, self.config, self.env)
            if self.rank == 0:
                launch.wait_ready(self.process, self.ready_timeout_s, echo=self._echo)
                self.address, self.http_address = self.process.address, self.process.http_address
            else:  # a follower prints no ready line: only keep its output flowing
                threading.Thread(target=self._pump, daemon=True).start()
            ready = True
        except Exception as exc:  # noqa: BLE001 - reported by ready() and status, then retried by Ray
            self.error = f"{self.kind} did not start: {exc}"
        finally:
            self.started.set()
        if self.process is not None:
            self.process.popen.wait()
        if self.stopping:
            return
        if not ready:
            time.sleep(FAILED_START_BACKOFF_S)
        print(f"[{self.kind}] server process ended (exit {self.process and self.process.popen.returncode}): "
              f"ending the actor so that Ray restarts it", flush=True)
        os._exit(1)

    def _echo(self, line: str) -> None:
        sys.stdout.write(f"[{self.kind}] {line}")

    def _pump(self) -> None:
        for line in self.process.popen.stdout:
            self._echo(line)

    # -- tensor-parallel followers ---------------------------------------------------------------
    def _start_followers(self, options: dict) -> None:
        """Ranks 1.. in the other bundles of this actor's placement group, rendezvousing with rank 0 on
        127.0.0.1 (STRICT_PACK: one node). Each sees only its own GPUs (Ray sets CUDA_VISIBLE_DEVICES)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from specdec.parallel import free_port

        group = ray.util.get_current_placement_group()
        tp = self.config.tp
        rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(tp),
                      "LOCAL_RANK": "0"}
        self.env.update(rendezvous, RANK="0")
        remote = ray.remote(ServerActor)
        for rank in range(1, tp):
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)
            self.followers.append(remote.options(**options, scheduling_strategy=strategy).remote(
                self.kind, self.config, {**self.env, "RANK": str(rank)}, self.ready_timeout_s, rank=rank))
        threading.Thread(target=self._watch_followers, name="followers", daemon=True).start()

    def _watch_followers(self) -> None:
        import ray

        ray.wait([f.wait_exit.remote() for f in self.followers], num_returns=1)
        if not self.stopping:
            print(f"[{self.kind}] a tensor-parallel rank ended: restarting the group", flush=True)
            os._exit(1)

    # -- methods ---------------------------------------------------------------------------------
    def ready(self) -> dict:
        """Wait until the server is ready (or failed): {"address", "http_address", "error"}."""
        self.started.wait(self.ready_timeout_s)
        return {"address": self.address, "http_address": self.http_address,
                "error": self.error or ("" if self.started.is_set() else "not ready yet")}

    def current_address(self) -> str:
        """The server's address now ("" until it is ready): what the router's discovery asks."""
        return self.address

    def wait_exit(self) -> int:
        """Returns when the server process has ended (tensor-parallel rank 0 watches its followers so)."""
        self.started.wait()
        if self.process is not None:
            self.process.popen.wait()
        return self.process.popen.returncode if self.process is not None else -1

    def describe(self) -> dict:
        import ray

        context = ray.get_runtime_context()
        running = self.process is not None and self.process.popen.poll() is None
        return {"kind": self.kind, "rank": self.rank, "node_ip": self.node_ip, "node_id": context.get_node_id(),
                "actor_pid": os.getpid(), "server_pid": self.process.popen.pid if self.process else 0,
                "address": self.address, "http_address": self.http_address, "error": self.error,
                "state": "serving" if running and self.address else "starting" if running else "down",
                "restarted": context.was_current_actor_reconstructed,
                "followers": len(self.followers)}

    def stop(self, grace_s: float | None = None) -> int:
        """SIGTERM: the server drains (its own drain_timeout_s) and exits; killed after the grace.
        This actor then stays idle: the caller kills it without restart."""
        self.stopping = True
        grace_s = drain_timeout_s(self.config) + STOP_MARGIN_S if grace_s is None else grace_s
        if self.process is not None and self.process.popen.poll() is None:
            self.process.popen.send_signal(signal.SIGTERM)
            try:
                self.process.popen.wait(grace_s)
            except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: it did not drain in time
                self.process.kill()
        for follower in self.followers:  # rank 0's exit stops them; these calls only wait for it
            follower.stop.remote(STOP_MARGIN_S)
        return self.process.popen.returncode if self.process is not None else 0


class RouterActor(ServerActor):
    """The router, plus discovery of the workers by asking their actors for their addresses every
    `interval_s` and writing what answers into the router's workers file (router.discovery). A worker
    that Ray is restarting does not answer and so drops out; it comes back, maybe on a new port, when
    its new server is ready."""

    def __init__(self, config, env: dict, ready_timeout_s: float, namespace: str, target_names: list[str],
                 draft_names: list[str], interval_s: float, ask_timeout_s: float = 1.0):
        self.namespace, self.names = namespace, {"targets": target_names, "drafts": draft_names}
        self.interval_s, self.ask_timeout_s = interval_s, ask_timeout_s
        import ray

        # one directory per router actor, the same across its restarts (its id does not change)
        directory = Path(tempfile.gettempdir()) / f"specdec-router-{ray.get_runtime_context().get_actor_id()}"
        directory.mkdir(exist_ok=True)
        self.workers_file = directory / "workers.yaml"
        self.published = None
        self._publish()  # before the router starts: it reads the file once at start
        config = dataclasses.replace(config, workers_file=str(self.workers_file), discovery_interval_s=interval_s)
        super().__init__("router", config, env, ready_timeout_s)
        threading.Thread(target=self._discover, name="discover", daemon=True).start()

    def _ask(self, names: list[str]) -> tuple[str, ...]:
        import ray

        refs = []
        for name in names:
            try:
                refs.append(ray.get_actor(name, namespace=self.namespace).current_address.remote())
            except ValueError:  # no such actor (now)
                continue
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=self.ask_timeout_s)
        addresses = []
        for ref in refs:
            if ref not in done:
                continue
            try:
                address = ray.get(ref)
            except Exception:  # noqa: BLE001 - RayActorError / ActorUnavailableError: it left
                continue
            if address:
                addresses.append(address)
        return tuple(addresses)

    def _publish(self) -> None:
        from specdec.worker_list import WorkerSet, write_workers_file

        found = WorkerSet(self._ask(self.names["targets"]), self._ask(self.names["drafts"]))
        if found != self.published:
            write_workers_file(self.workers_file, found)
            self.published = found

    def _discover(self) -> None:
        while True:
            time.sleep(self.interval_s)
            try:
                self._publish()
            except Exception as exc:  # noqa: BLE001 - next round
                print(f"[router] discovery failed: {exc}", flush=True)

    def stop(self, grace_s: float | None = None) -> int:
        code = super().stop(grace_s)
        shutil.rmtree(self.workers_file.parent, ignore_errors=True)
        return code

    def workers(self) -> dict:
        """What the router is told now: {"targets": [...], "drafts": [...]}."""
        published = self.published
        return {"targets": list(published.targets), "drafts": list(published.drafts)} if published else {}
