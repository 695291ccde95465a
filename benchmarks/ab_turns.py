"""Two source trees' worker processes taking turns: what kernel_ab.py and forward_ab.py share.

A worker is `worker(tree, conn, args)`, a module-level function (spawned processes import it by name): it
sends one message when ready (what its tree computed, for comparing bits), then answers each True it
receives with one reply (that turn's timing) and returns on False.
"""
from __future__ import annotations

import multiprocessing as mp
import sys
from typing import Any, Callable


def take_turns(worker: Callable, args: Any, turns: int, check: Callable[[list], None] | None = None,
               join_timeout_s: float = 60.0) -> tuple[list, tuple[list, list]]:
    """Each of args.trees's worker (spawned), their ready messages (passed to `check`, which may raise before any
    turn), and their replies to `turns` turns; which tree goes first alternates turn by turn, so drift on a
    shared machine hits both alike. The workers are told to stop and joined whatever happens."""
    context = mp.get_context("spawn")
    pipes, procs = [], []
    for tree in args.trees:
        mine, theirs = context.Pipe()
        proc = context.Process(target=worker, args=(tree, theirs, args))
        proc.start()
        pipes.append(mine)
        procs.append(proc)
    try:
        first = [pipe.recv() for pipe in pipes]
        if check is not None:
            check(first)
        replies: tuple[list, list] = ([], [])
        for turn in range(turns):
            for i in ((0, 1) if turn % 2 else (1, 0)):
                pipes[i].send(True)
                replies[i].append(pipes[i].recv())
    finally:
        for pipe in pipes:
            pipe.send(False)
        for proc in procs:
            proc.join(timeout=join_timeout_s)
    return first, replies


def bits_verdict(same: list[bool], allow_different: bool, message: str) -> int:
    """The exit code for the pairs' bit comparisons: 1 (with `message` on stderr) where some pair's A and B
    differed and that was not allowed, else 0."""
    if all(same) or allow_different:
        return 0
    print(message, file=sys.stderr)
    return 1
