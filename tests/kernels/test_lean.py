"""The lean forward (specdec.kernels.lean): bitwise what transformers' walk over the same kernels gives,
row-invariant, EAGLE-3 feature capture kept, and transformers' walk wherever it cannot run."""
from __future__ import annotations

import pytest
import torch

from specdec.kernels.build import load_kernel
from specdec.models.loader import load_model
from specdec.models.runner import ModelRunner, RunnerConfig

KERNEL = load_kernel()
needs_kernel = pytest.mark.skipif(KERNEL.module is None or KERNEL.isa == "scalar",
                                  reason=f"lean forward needs the AVX2 or AVX-512 kernels ({KERNEL.reason or KERNEL.isa})")
DTYPES = [torch.float32] + ([torch.bfloat16] if KERNEL.runs_bf16 else [])


def runners(path, dtype) -> tuple[ModelRunner, ModelRunner]:
    """(lean, transformers' walk) over two copies of one checkpoint, both on specdec's kernels."""
    lean = ModelRunner(load_model(path, dtype).model, config=RunnerConfig(linear_kernel="specdec"))
    walk = ModelRunner(load_model(path, dtype).model, config=RunnerConfig(linear_kernel="specdec", lean_forward=False))
    assert lean.lean is not None and walk.lean is None
    return lean, walk


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def num_threads(request):
    """Torch's threads: with 2, the stack runs some forwards as a team and some alone (its policy times both)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_lean_equals_transformers_walk_bitwise(tiny_target, dtype, num_threads):
    lean, walk = runners(tiny_target, dtype)
    caches = [r.new_cache(16) for r in (lean, walk)]
    steps = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [5], [8, 9, 7], [9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9]]
    for ids in steps:  # prefill, a decode step, two chain verifies (the cache grows twice past 16)
        (la, ha), (lb, hb) = (r.forward(ids, c) for r, c in zip((lean, walk), caches))
        assert torch.equal(ha, hb) and torch.equal(la, lb)
    assert caches[0].length == caches[1].length == sum(map(len, steps))
    assert torch.equal(caches[0].store[..., :caches[0].length, :], caches[1].store[..., :caches[1].length, :])
    # a tree step: explicit mask (siblings hidden) and positions by depth
    num_cached = caches[0].length
    bias = torch.zeros(1, 1, 4, num_cached + 4, dtype=dtype)
    bias[0, 0, :, num_cached:] = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 1, 0]],
                                              dtype=torch.bool).to(dtype) * torch.finfo(dtype).min
    positions = torch.tensor([[0, 1, 1, 2]]) + num_cached
    (la, ha), (lb, hb) = (r.forward([7, 1, 2, 5], c, attn_bias=bias, positions=positions)
                          for r, c in zip((lean, walk), caches))
    assert torch.equal(ha, hb) and torch.equal(la, lb)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_of_a_verify_equal_one_token_steps_bitwise(tiny_target, dtype, num_threads):
    lean, _ = runners(tiny_target, dtype)
    prompt, drafts = [3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8, 9, 7]
    many = lean.new_cache(32)
    lean.forward(prompt, many)
    _, verify = lean.forward(drafts, many)  # 8 rows at once
    one = lean.new_cache(32)
    lean.forward(prompt, one)
    for i, token in enumerate(drafts):
        _, step = lean.forward([token], one)
        assert torch.equal(step[0], verify[i]), i


@needs_kernel
def test_batched_forward_equals_walk_and_each_sequence_alone(tiny_target, num_threads):
    lean, walk = runners(tiny_target, torch.float32)
    ids = torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6]])
    caches = [r.new_cache(16) for r in (lean, walk)]
    bias = torch.zeros(2, 1, 4, 4)
    bias[:, 0] = torch.full((4, 4), float("-inf")).triu(1)
    positions = torch.arange(4).expand(2, 4)
    got, want = (r.forward_batch(ids, c, bias, positions) for r, c in zip((lean, walk), caches))
    assert got.shape == (2, 4, 64) and torch.equal(got, want)
    alone = lean.new_cache(16)
    _, hidden = lean.forward(ids[1].tolist(), alone)
    assert torch.equal(hidden, got[1])


@needs_kernel
def test_captured_layers_match_the_walks_hooks(tiny_target):
    lean, walk = runners(tiny_target, torch.float32)
    for r in (lean, walk):
        r.capture_layers((1, 2))
    (_, ha), (_, hb) = (r.forward([3, 1, 4, 1, 5], r.new_cache(16)) for r in (lean, walk))
    fa, fb = lean.features(ha), walk.features(hb)
    assert fa.shape == (5, 128) and torch.equal(fa, fb)
    assert not torch.equal(fa[:, :64], fa[:, 64:])  # two different layers, not one kept twice


@needs_kernel
def test_falls_back_where_it_cannot_run(tiny_target, tiny_draft):
    lean, walk = runners(tiny_target, torch.float32)
    dynamic = ModelRunner(load_model(tiny_target, torch.float32).model,
                          config=RunnerConfig(linear_kernel="specdec", kv_cache="dynamic"))
    assert not dynamic.lean.runs(dynamic.new_cache(), 1)
    cache = lean.new_cache(300)
    assert not lean.lean.runs(cache, 200)  # a long prefill chunk: transformers' walk with sdpa
    prompt = [i % 90 for i in range(200)]
    (_, ha), (_, hb) = (r.forward(prompt, r.new_cache(300)) for r in (lean, walk))
    assert torch.equal(ha, hb)
    torch_kernels = ModelRunner(load_model(tiny_target, torch.float32).model,
                                config=RunnerConfig(linear_kernel="torch"))
    assert torch_kernels.lean is None
    odd_heads = ModelRunner(load_model(tiny_draft, torch.float32).model, config=RunnerConfig(linear_kernel="specdec"))
    assert odd_heads.lean is None  # head_dim 8: the attention kernel needs multiples of 16


@needs_kernel
def test_lean_close_to_torch_kernels_on_smollm(smol_path):
    lean = ModelRunner(load_model(smol_path, torch.float32).model)
    plain = ModelRunner(load_model(smol_path, torch.float32).model, config=RunnerConfig(linear_kernel="torch"))
    assert lean.lean is not None and plain.lean is None
    ids = [1, 504, 3458, 282, 4195, 314, 260, 1345, 30, 2]
    (la, _), (lb, _) = (r.forward(ids, r.new_cache(32)) for r in (lean, plain))
    torch.testing.assert_close(la, lb, rtol=1e-3, atol=2e-3)
    assert torch.equal(la.argmax(-1), lb.argmax(-1))


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_team_of_threads_gives_the_one_thread_bits_on_smollm(smol_path, dtype):
    """SmolLM2's real shapes (9 heads over 3 kv heads, 576 wide): the forward split over a team of two
    threads (products by tiles, attention by units, norms by rows) is bitwise the forward on one thread."""
    lean = ModelRunner(load_model(smol_path, dtype).model)
    lean.lean.team.threads = lambda num_rows, available: available  # no choosing by time: the team when 2
    steps = [[1, 504, 3458, 282, 4195, 314, 260, 1345, 30, 2], [17], [28, 351, 1345, 30, 2, 9, 12]]
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            cache = lean.new_cache(64)
            results.append([lean.forward(ids, cache) for ids in steps])
    finally:
        torch.set_num_threads(before)
    for (la, ha), (lb, hb) in zip(*results):
        assert torch.equal(la, lb) and torch.equal(ha, hb)


@needs_kernel
def test_steps_whose_forward_the_team_probed_are_not_timed(tiny_target, monkeypatch):
    """The thread team's warm-up and probes run forwards the slower way on purpose; the decode steps
    that ran one tell the speculation policy so (timed=False), and only those."""
    from specdec.core.types import SamplingParams
    from specdec.engine import Engine
    from specdec.policy import SpeculationPolicy

    flags, record = [], SpeculationPolicy.record

    def spy(self, *args, timed=True, **kwargs):
        flags.append((timed, engine.runner.num_team_probes))
        return record(self, *args, timed=timed, **kwargs)

    monkeypatch.setattr(SpeculationPolicy, "record", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = Engine(load_model(tiny_target, torch.float32), None)
        engine.generate([3, 1, 4, 1, 5], SamplingParams(max_new_tokens=12))
    finally:
        torch.set_num_threads(before)
    untimed = [not timed for timed, _ in flags]
    probes = [count for _, count in flags]  # the team's probe count after each step
    assert untimed[1:] == [now > then for then, now in zip(probes, probes[1:])]  # exactly where it moved
    assert sum(untimed) >= 2  # the warm-up ran one-row forwards alone


@needs_kernel
def test_the_target_worker_does_not_time_the_steps_the_team_probed(tiny_target, monkeypatch):
    """The served path too: the target worker tells its speculation policy which steps ran a forward the
    thread team timed the slower way (timed=False), and only those. Learnt as a step's cost, a warm-up
    forward run alone (about twice a team's) priced the batch size it met first for many steps after."""
    from specdec.core.types import SamplingParams
    from specdec.engine import Engine
    from specdec.policy import SpeculationPolicy
    from specdec.serving_config import TargetConfig
    from specdec import step as step_module
    from target_service.worker import TargetWorker

    flags, record, verify = [], SpeculationPolicy.record, step_module.verify_each

    def spy(self, *args, timed=True, **kwargs):
        flags[-1].append(timed)
        return record(self, *args, timed=timed, **kwargs)

    def verify_each(runner, *args, **kwargs):  # the team's probe count before and after each step's forward
        flags.append([runner.num_team_probes])
        results = verify(runner, *args, **kwargs)
        flags[-1].append(runner.num_team_probes)
        return results

    monkeypatch.setattr(SpeculationPolicy, "record", spy)
    monkeypatch.setattr(step_module, "verify_each", verify_each)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    worker = TargetWorker(Engine(load_model(tiny_target, torch.float32), None), TargetConfig())
    try:
        state = worker.admit("s", [3, 1, 4, 1, 5], SamplingParams(max_new_tokens=12, ignore_eos=True), False)
        commits = []
        while (message := state.outbox.get(timeout=60)) is not None and not isinstance(message, Exception):
            commits.append(message)
            if message.finish_reason:
                break
    finally:
        worker.stop()
        torch.set_num_threads(before)
    assert sum(len(c.token_ids) for c in commits) == 12
    assert [not timed for _, _, timed in flags] == [after > before for before, after, _ in flags]
    assert sum(after > before for before, after, _ in flags) >= 1  # the warm-up ran forwards alone


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_ragged_rows_are_the_padded_forwards_rows_bitwise(tiny_target, dtype, num_threads):
    """forward_rows computes each sequence's own rows only (trees of 1, 4 and 2 nodes in a 4-row batch):
    they are bitwise the padded forward's. The columns of rows a sequence lacks get zeros, not what the
    store held: here NaN, which a hidden key would still carry into the products (NaN x 0)."""
    lean, _ = runners(tiny_target, dtype)
    prompts = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3], [5, 8, 9, 7, 9]])
    ids, seq_rows = torch.tensor([[7, 0, 0, 0], [1, 2, 5, 6], [4, 3, 0, 0]]), [1, 4, 2]
    causal = torch.zeros(3, 1, 5, 5, dtype=dtype).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1),
                                                              torch.finfo(dtype).min)
    bias = torch.zeros(3, 1, 4, 9, dtype=dtype)
    bias[:, 0, :, 5:] = torch.full((4, 4), torch.finfo(dtype).min, dtype=dtype).triu(1)  # chains
    positions = (5 + torch.arange(4)).expand(3, 4)
    rows = []
    for ragged in (False, True):
        cache = lean.new_cache(16)
        lean.forward_batch(prompts, cache, causal, torch.arange(5).expand(3, 5))
        with torch.inference_mode():
            cache.store[..., 5:, :] = float("nan")
        if ragged:
            rows.append(lean.forward_rows(ids, cache, bias, positions, seq_rows))
        else:
            padded = lean.forward_batch(ids, cache, bias, positions)
            rows.append(torch.cat([padded[b, :n] for b, n in enumerate(seq_rows)]))
    assert rows[1].shape == (7, 64) and torch.equal(rows[0], rows[1])
    assert torch.all(cache.store[:, :, 0, :, 6:9] == 0) and torch.all(cache.store[:, :, 2, :, 7:9] == 0)
    assert not torch.isnan(cache.store[..., :9, :]).any()
