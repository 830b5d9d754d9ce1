"""Server faults once found under concurrent, adversarial load, each as a short
deterministic check: a lone surrogate escape in a request, a body its client cut short, the
shared prompt tokens of a preempted request, a request without a limit under context
shift."""
import asyncio
import threading

import httpx
import pytest
from server_harness import (
    MODEL_ID,
    Gate,
    LiveServer,
    bundled_llama,
    metrics,
    wait_until,
)

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def live():
    server = LiveServer(bundled_llama(n_seq_max=2, n_ctx=256)).wait_ready()
    yield server
    assert server.stop() == 0


def post_raw(live, body):
    return httpx.post(live.url + "/v1/completions", content=body,
                      headers={"content-type": "application/json"}, timeout=60)


def test_lone_surrogate_in_an_echoed_prompt_is_not_a_500(live):
    r = post_raw(live, rb'{"prompt": "ROMEO \ud800", "max_tokens": 1, "echo": true}')
    assert r.status_code in (200, 400), r.text


def test_lone_surrogate_in_an_unknown_model_name_is_a_404(live):
    r = post_raw(live, rb'{"prompt": "ROMEO", "max_tokens": 1, "model": "x\ud800"}')
    assert r.status_code in (400, 404), r.text


def test_a_client_gone_while_sending_its_body_is_not_a_server_error(live):
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions",
             "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"100")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    messages = [{"type": "http.request", "body": b'{"prompt": ', "more_body": True},
                {"type": "http.disconnect"}]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    raised = None
    try:
        asyncio.run(live.server.app(scope, receive, send))
    except Exception as exc:    # noqa: BLE001 - what the server lets out is the finding
        raised = exc
    statuses = [m["status"] for m in sent if m["type"] == "http.response.start"]
    assert raised is None and 500 not in statuses, (repr(raised), statuses)


def test_shared_prompt_tokens_count_only_other_requests_prompts():
    # a pool of 4 pages (64 tokens) for two sequences of 40 tokens: the younger is
    # preempted when the elder needs its third page, and read again when it ends
    gate = Gate()
    live = LiveServer(gate.wrap(bundled_llama(n_seq_max=2, n_ctx=64))).wait_ready()
    try:
        answers = {}

        def ask(prompt):
            answers[prompt] = live.client().completions.create(
                model=MODEL_ID, prompt=prompt, max_tokens=40, temperature=0)
        threads = []
        for i, prompt in enumerate(("ROMEO.", "JULIET.")):     # one after the other
            threads.append(threading.Thread(target=ask, args=(prompt,)))
            threads[-1].start()
            wait_until(lambda n=i + 1: live.scheduler.admitted == n, "the request admitted")
        gate.open()
        for thread in threads:
            thread.join(60)
        assert [a.usage.completion_tokens for a in answers.values()] == [40, 40]
        m = metrics(live.url)
        # neither prompt fills a page, so neither can be found in another's pages
        assert m["ggml_server_prompt_tokens_shared_total"] == 0, \
            (m["ggml_server_prompt_tokens_shared_total"], m["ggml_server_prompt_tokens_total"])
    finally:
        live.stop()


def test_a_request_without_a_limit_ends_under_context_shift():
    live = LiveServer(bundled_llama(n_seq_max=2, n_ctx=256), context_shift=True,
                      n_ctx_seq=32).wait_ready()
    try:
        n_ctx_train = live.scheduler.llm.config.n_ctx_train
        chunks = 0
        stream = live.client(timeout=60).chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Who is there?"}],
            temperature=0, stream=True)     # greedy, it repeats itself without an end
        for _ in stream:
            chunks += 1
            if chunks > n_ctx_train + 10:
                break
        stream.close()
        # the role's chunk, a chunk a token, the finish_reason's chunk
        assert chunks <= n_ctx_train + 2, f"still generating after {chunks} chunks"
    finally:
        live.stop()
