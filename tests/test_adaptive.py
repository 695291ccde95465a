"""The speculation controller: backs off to plain decoding when drafts always fail, speculates deep when they pass."""
from specdec.adaptive import AdaptiveConfig, SpeculationController

T_PLAIN, T_EXTRA, T_DRAFT = 0.053, 0.045, 0.004  # SmolLM2 on this CPU: 1-token forward, verify overhead, draft


def simulate(accept_all: bool, steps: int = 400, max_tokens: int = 8):
    """Returns (time with speculation, time of plain decoding) for the same number of emitted tokens."""
    controller = SpeculationController(AdaptiveConfig(max_tokens=max_tokens))
    elapsed, emitted, ks = 0.0, 0, []
    for _ in range(steps):
        k = controller.num_tokens()
        ks.append(k)
        cost = T_PLAIN + (T_EXTRA + k * T_DRAFT if k else 0.0)
        accepted = k if accept_all else 0
        controller.record(k, accepted, cost)
        elapsed += cost
        emitted += accepted + 1
    return elapsed, emitted * T_PLAIN, ks


def test_always_wrong_drafts_cost_at_most_ten_percent():
    spec, plain, ks = simulate(accept_all=False)
    assert spec <= 1.10 * plain
    assert sum(1 for k in ks[-200:] if k) <= 200 / 16  # only occasional probes late on


def test_always_right_drafts_use_the_maximum():
    spec, plain, ks = simulate(accept_all=True)
    assert ks[-1] == 8
    assert spec < plain / 3


def test_disabled_always_drafts_maximum():
    controller = SpeculationController(AdaptiveConfig(max_tokens=5, enabled=False))
    controller.record(5, 0, 1.0)
    assert controller.num_tokens() == 5
