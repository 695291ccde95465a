"""The team policy (specdec.kernels.team): one thread or all, by measured cost per forward size."""
from __future__ import annotations

from specdec.kernels.team import TeamConfig, TeamPolicy


def run(policy: TeamPolicy, num_rows: int, cost_s: dict[str, float], num_calls: int) -> list[int]:
    """Threads chosen over `num_calls` forwards whose time is cost_s['team'] on 2 threads, ['alone'] on 1."""
    chosen = []
    for _ in range(num_calls):
        threads = policy.threads(num_rows, available=2)
        policy.record(num_rows, threads, cost_s["team" if threads > 1 else "alone"])
        chosen.append(threads)
    return chosen


def test_one_thread_available_means_one_thread():
    policy = TeamPolicy()
    assert all(policy.threads(rows, available=1) == 1 for rows in (1, 8, 64))


def test_it_times_both_ways_then_runs_the_cheaper_and_probes_the_other_ever_less_often():
    config = TeamConfig(num_warmup=3, probe_every=10, max_probe_every=80)
    policy = TeamPolicy(config)
    chosen = run(policy, 1, {"team": 0.013, "alone": 0.019}, 400)
    assert chosen[:6].count(2) == 3 and chosen[:6].count(1) == 3  # warm-up: three each
    probes = [i for i, threads in enumerate(chosen) if threads == 1 and i >= 6]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[:3] == [20, 40, 80] and set(gaps[3:]) == {80}  # each confirming probe doubles the interval
    assert policy.num_probes == 3 + len(probes)  # the warm-up's forwards alone count as probes too
    team_ms, alone_ms = policy.costs_ms()[1]
    assert abs(team_ms - 13.0) < 1e-6 and abs(alone_ms - 19.0) < 1e-6


def test_a_busy_machine_turns_it_to_one_thread_and_an_idle_one_back():
    policy = TeamPolicy(TeamConfig(num_warmup=2, probe_every=4, max_probe_every=64, window=3))
    assert run(policy, 1, {"team": 0.013, "alone": 0.019}, 100)[-8:] == [2] * 8  # probes backed off
    # a neighbour takes a core: the team's own cost drifts, which probes at once, long before the interval
    busy = run(policy, 1, {"team": 0.035, "alone": 0.023}, 40)
    assert busy.index(1) <= 3 and busy[-8:].count(1) == 6  # one thread: the team re-timed every 4th
    idle = run(policy, 1, {"team": 0.013, "alone": 0.019}, 40)
    assert idle[-8:].count(2) >= 7


def test_the_drift_of_the_chosen_way_probes_whatever_the_interval():
    policy = TeamPolicy(TeamConfig(num_warmup=2, probe_every=1000, max_probe_every=1000, drift=0.2))
    run(policy, 1, {"team": 0.013, "alone": 0.019}, 20)
    probes = policy.num_probes
    assert run(policy, 1, {"team": 0.014, "alone": 0.019}, 20) == [2] * 20  # +8%: within the drift
    assert policy.num_probes == probes
    assert 1 in run(policy, 1, {"team": 0.030, "alone": 0.019}, 5)


def test_one_slow_forward_does_not_turn_it():
    policy = TeamPolicy(TeamConfig(num_warmup=3, probe_every=1000, window=5))
    run(policy, 1, {"team": 0.013, "alone": 0.019}, 10)
    policy.record(1, 2, 0.200)  # a page fault, the garbage collector
    assert run(policy, 1, {"team": 0.013, "alone": 0.019}, 10) == [2] * 10


def test_sizes_are_chosen_apart():
    policy = TeamPolicy(TeamConfig(num_warmup=2, probe_every=1000))
    run(policy, 1, {"team": 0.020, "alone": 0.010}, 10)  # one row: alone is cheaper
    run(policy, 16, {"team": 0.020, "alone": 0.040}, 10)  # sixteen rows: the team is
    assert policy.threads(1, available=2) == 1 and policy.threads(16, available=2) == 2
