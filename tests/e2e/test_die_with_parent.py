"""A spawned server ends with the process that started it: asked by the child itself at start
(specdec.launch.die_with_parent), so subprocess needs no preexec_fn and never runs gRPC's fork handlers."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from specdec.launch import PARENT_ENV

pytestmark = pytest.mark.e2e
SLEEPER = "from specdec.launch import die_with_parent; die_with_parent(); import time; time.sleep(60)"
MIDDLE = f"""
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {SLEEPER!r}], env={{**os.environ, {PARENT_ENV!r}: str(os.getpid())}})
print(child.pid, flush=True)
sys.stdin.readline()  # lives until the test says so
"""


def gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            with open(f"/proc/{pid}/stat") as stat:  # a zombie (reparented, not yet reaped) has ended too
                if stat.read().split()[2] == "Z":
                    return True
        except FileNotFoundError:  # reaped meanwhile
            return True
        time.sleep(0.05)
    return False


def test_a_spawned_process_ends_with_its_parent():
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    child = int(middle.stdout.readline())
    try:
        time.sleep(1.0)  # the child has asked by now
        assert not gone(child, 0.2)  # alive while its parent is
        middle.stdin.close()
        middle.wait(10)
        assert gone(child, 10.0)
    finally:
        for pid in (child, middle.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_process_whose_parent_already_ended_ends_at_once():
    # the pid it is told to live with is not its parent: as if that parent ended before the request
    child = subprocess.Popen([sys.executable, "-c", SLEEPER], env={**os.environ, PARENT_ENV: "1"})
    try:
        assert child.wait(20) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(5)
