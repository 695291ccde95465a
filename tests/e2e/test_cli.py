"""`specdec serve` (whole stack, embedded SmolLM2 + prompt lookup; and --config YAML) and
`specdec generate --server`: same --json output as in process, same tokens; the stack's
OpenAI-compatible HTTP API too."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from specdec.core.types import SamplingParams
from specdec.launch import PARENT_ENV

pytestmark = pytest.mark.e2e
READY = re.compile(r"ready.*?(127\.0\.0\.1:\d+)")
HTTP = re.compile(r"HTTP API on http://(127\.0\.0\.1:\d+)/v1")
METRICS = re.compile(r"(router|target|draft) http://(127\.0\.0\.1:\d+)/metrics")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def serve(args: list[str], timeout_s: float = 150.0):
    """Start `specdec serve ...`; return (process, router address, HTTP API address, {kind: Prometheus
    address}) once it is ready."""
    process = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env={**ENV, PARENT_ENV: str(os.getpid())})
    deadline = time.monotonic() + timeout_s
    for line in process.stdout:  # the stack prints exactly one line on stdout: the ready line
        match = READY.search(line)
        if match:
            return process, match.group(1), HTTP.search(line).group(1), dict(METRICS.findall(line))
        assert time.monotonic() < deadline
    stop(process)
    raise AssertionError("specdec serve exited before it was ready")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def generate_json(address: str, prompt: str, *flags: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "specdec.cli", "generate", prompt, "--server", address, "--json",
                             "--timeout-s", "120", *flags], capture_output=True, text=True, env=ENV, timeout=150)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
def test_serve_embedded_stack_matches_in_process():
    import openai

    from specdec.engine import Engine

    process, address, http_address, metrics = serve(["--metrics-port", "0"])
    try:
        out = generate_json(address, "List three colours:", "--max-new-tokens", "24", "--chat")
        with openai.OpenAI(base_url=f"http://{http_address}/v1", api_key="unused", max_retries=0, timeout=120) as c:
            chat = c.chat.completions.create(model="smollm2-135m-instruct", max_tokens=24, extra_body={
                "return_token_ids": True}, messages=[{"role": "user", "content": "List three colours:"}])
    finally:
        stop(process)
    engine = Engine.from_pretrained(drafter="ngram")
    expected = engine.generate("List three colours:", SamplingParams(max_new_tokens=24), chat=True)
    assert out["token_ids"] == expected.token_ids and out["text"] == expected.text
    assert out["finish_reason"] == expected.finish_reason
    (choice,) = chat.choices  # the same generation through the HTTP API
    assert choice.model_extra["token_ids"] == expected.token_ids and choice.message.content == expected.text
    assert choice.finish_reason == {"eos": "stop"}.get(expected.finish_reason, expected.finish_reason)
    assert set(out) >= {"tau", "acceptance_rate", "tokens_per_s", "num_target_forwards", "num_accepted_per_pos"}
    assert set(metrics) == {"router", "target", "draft"}  # --metrics-port: one endpoint per server


def test_serve_config_file(tmp_path, tiny_models, reference):
    import socket

    import httpx

    with socket.socket() as sock:  # a port that was free a moment ago, for router.http_port
        sock.bind(("127.0.0.1", 0))
        http_port = sock.getsockname()[1]
    config = tmp_path / "stack.yaml"
    config.write_text(f"router: {{max_queue: 4, max_active_per_user: 1, max_queued_per_user: 1, "
                      f"http_port: {http_port}, metrics_port: 0}}\n"
                      f"targets:\n  - {{model: {tiny_models['target']}, dtype: float32, num_threads: 1, "
                      f"max_kv_tokens: 4096}}\n"
                      f"drafts:\n  - {{drafter: ngram, target_model: {tiny_models['target']}}}\n")
    process, address, http_address, metrics = serve(["--config", str(config)])
    try:
        out = generate_json(address, "Hello", "--max-new-tokens", "20", "--user", "alice")
        scraped = httpx.get(f"http://{metrics['router']}/metrics", timeout=10).text
        assert http_address == f"127.0.0.1:{http_port}"
        completion = httpx.post(f"http://{http_address}/v1/completions", timeout=60,
                                json={"prompt": "Hello", "max_tokens": 20, "return_token_ids": True}).json()
        bad = subprocess.run([sys.executable, "-m", "specdec.cli", "generate", "", "--server", address],
                             capture_output=True, text=True, env=ENV, timeout=60)
        per_user_caps_hold(address)
    finally:
        stop(process)
    assert out["token_ids"] == reference("ngram", "Hello", SamplingParams(max_new_tokens=20)).token_ids
    assert completion["choices"][0]["token_ids"] == out["token_ids"]
    assert bad.returncode == 2 and "prompt is empty" in bad.stderr
    assert set(metrics) == {"router"}  # only the router's metrics_port is set in the file
    assert f"specdec:spec_decode_num_accepted_tokens_total {float(out['num_accepted_tokens'])}" in scraped


def per_user_caps_hold(address: str) -> None:
    """The file's caps reach the router: alice runs one generation and queues one; her third is refused
    at once, while bob, under his own caps, is served beside her."""
    import threading

    from specdec.client import Client
    from specdec.errors import ResourceExhausted

    long = SamplingParams(max_new_tokens=900, ignore_eos=True)
    short = SamplingParams(max_new_tokens=4, ignore_eos=True)
    with Client(address) as client:
        info = client.server_info()
        assert (info.max_active_per_user, info.max_queued_per_user, info.max_queue) == (1, 1, 4)
        running = client.stream([3, 1, 4], long, timeout_s=120, user="alice")
        next(running)
        queued: dict = {}
        waiter = threading.Thread(target=lambda: queued.update(out=client.generate([2, 7], short, timeout_s=120,
                                                                                    user="alice")))
        waiter.start()
        deadline = time.monotonic() + 30
        while client.server_info().num_queued < 1:
            assert time.monotonic() < deadline, "alice's second request never queued"
            time.sleep(0.05)
        with pytest.raises(ResourceExhausted, match=r"user 'alice': 1 of their requests already queued \(limit 1\)"):
            client.generate([1, 1], short, timeout_s=30, user="alice")
        assert len(client.generate([5, 5], short, timeout_s=60, user="bob").token_ids) == 4
        users = {u.user: (u.num_active, u.num_queued) for u in client.server_info().users}
        assert users["alice"] == (1, 1) and "out" not in queued  # still behind her running one
        running.close()  # ends alice's first: her queued one starts
        waiter.join(60)
    assert len(queued["out"].token_ids) == 4
