"""Every bad request gets OpenAI's error schema and its status, never a 500, and the server
goes on serving; the API key; the bounded queue (503); loading (503), a model that fails."""
import asyncio
import json
import socket
import threading
import time

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

from ggml_py.serve.run import TIMEOUT_GRACEFUL_S

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def live():
    server = LiveServer(bundled_llama(n_seq_max=2, n_ctx=512)).wait_ready()
    yield server
    assert server.stop() == 0


def assert_error(r, status, type="invalid_request_error", param=None, code=None):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == type
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


def post(live, path, body, **kwargs):
    if isinstance(body, (bytes, str)):
        return httpx.post(live.url + path, content=body,
                          headers={"content-type": "application/json"}, **kwargs)
    return httpx.post(live.url + path, json=body, **kwargs)


GOOD = {"prompt": "ROMEO.", "max_tokens": 2}

BAD_COMPLETIONS = [
    # (body, param or None); each a 400 invalid_request_error
    (b'{"prompt": "ROMEO.", ', None),                   # malformed JSON
    (b'["ROMEO."]', None),                              # not an object
    (b'{"prompt": "\xff\xfe"}', None),                  # not UTF-8
    (b'{"prompt": "ROMEO.", "temperature": NaN}', None),
    (rb'{"prompt": "ROMEO \ud800", "max_tokens": 1, "echo": true}', None),   # a lone surrogate,
    (rb'{"prompt": "ROMEO", "max_tokens": 1, "model": "x\ud800"}', None),    # echoed or named
    ({"max_tokens": 2}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["ROMEO.", 5]}, "prompt"),
    ({"prompt": [1, 99999]}, "prompt"),                 # a token id past the vocabulary
    ({"prompt": [-1]}, "prompt"),
    ({**GOOD, "max_tokens": "5"}, "max_tokens"),
    ({**GOOD, "max_tokens": 1.5}, "max_tokens"),
    ({**GOOD, "max_tokens": -5}, "max_tokens"),
    ({**GOOD, "max_tokens": 0}, "max_tokens"),
    ({**GOOD, "max_tokens": 10 ** 30}, "max_tokens"),
    ({**GOOD, "temperature": -1}, "temperature"),
    ({**GOOD, "temperature": 1e9}, "temperature"),
    ({**GOOD, "temperature": "hot"}, "temperature"),
    ({**GOOD, "temperature": True}, "temperature"),
    ({**GOOD, "top_p": 1.5}, "top_p"),
    ({**GOOD, "top_p": -0.1}, "top_p"),
    ({**GOOD, "top_k": -3}, "top_k"),
    ({**GOOD, "n": 0}, "n"),
    ({**GOOD, "n": 10 ** 6}, "n"),
    ({**GOOD, "seed": -5}, "seed"),
    ({**GOOD, "seed": "x"}, "seed"),
    ({**GOOD, "stop": 5}, "stop"),
    ({**GOOD, "stop": [""]}, "stop"),
    ({**GOOD, "stop": ["a"] * 100}, "stop"),
    ({**GOOD, "stream": "yes"}, "stream"),
    ({**GOOD, "logprobs": 100}, "logprobs"),
    ({**GOOD, "presence_penalty": 1.0}, "presence_penalty"),
    ({**GOOD, "logit_bias": {"1": 5}}, "logit_bias"),
    ({**GOOD, "model": 5}, "model"),
    ({**GOOD, "stream_options": 5}, "stream_options"),
    ({**GOOD, "stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
]


@pytest.mark.parametrize("body, param", BAD_COMPLETIONS)
def test_bad_completion_requests(live, body, param):
    assert_error(post(live, "/v1/completions", body), 400, param=param)


MESSAGE = {"role": "user", "content": "Hi"}
BAD_CHATS = [
    ({}, "messages"),
    ({"messages": "Hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [5]}, "messages[0]"),
    ({"messages": [{"content": "Hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "Hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages"),
    ({"messages": [MESSAGE], "tools": [{"type": "function"}]}, "tools"),
    ({"messages": [MESSAGE], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [MESSAGE], "max_completion_tokens": -2}, "max_completion_tokens"),
    ({"messages": [MESSAGE], "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": [MESSAGE], "max_completion_tokens": 0, "max_tokens": 3}, "max_completion_tokens"),
    ({"messages": [MESSAGE], "response_format": {"type": "json_object"}}, "response_format"),
]


@pytest.mark.parametrize("body, param", BAD_CHATS)
def test_bad_chat_requests(live, body, param):
    assert_error(post(live, "/v1/chat/completions", body), 400, param=param)


def test_an_unknown_model_is_404(live):
    assert_error(post(live, "/v1/completions", {**GOOD, "model": "gpt-4"}), 404, param="model",
                 code="model_not_found")
    with pytest.raises(openai.NotFoundError):
        live.client().chat.completions.create(model="gpt-4", messages=[MESSAGE])
    with pytest.raises(openai.NotFoundError):
        live.client().models.retrieve("gpt-4")
    label = 'ggml_server_http_requests_total{path="/v1/models/(name)",status="%s"}'
    before = metrics(live.url)
    assert live.client().models.retrieve(MODEL_ID).id == MODEL_ID    # (the served one is there)
    after = metrics(live.url)            # every name counted under the route's one label
    assert after[label % 200] == before.get(label % 200, 0) + 1


def test_a_prompt_far_past_the_context_is_refused_before_it_is_tokenized(live):
    huge = "ab cd " * 200_000                  # 1.2 MB: seconds of tokenizing
    for path, body, param in (("/v1/completions", {"prompt": huge}, "prompt"),
                              ("/v1/chat/completions",
                               {"messages": [{"role": "user", "content": huge}]}, "messages")):
        error = assert_error(post(live, path, body), 400, param=param,
                             code="context_length_exceeded")
        assert "the prompt has at least" in error["message"]


def test_a_prompt_longer_than_the_context_gives_both_counts(live):
    n_ctx = live.scheduler.n_ctx_seq
    error = assert_error(post(live, "/v1/completions", {"prompt": "ROMEO. " * n_ctx}), 400,
                         param="prompt", code="context_length_exceeded")
    n_prompt = len(live.scheduler.llm.tokenize("ROMEO. " * n_ctx, special=True))
    assert f"{n_ctx} tokens" in error["message"] and f"{n_prompt} tokens" in error["message"]
    chat = [{"role": "user", "content": "ROMEO. " * n_ctx}]
    assert_error(post(live, "/v1/chat/completions", {"messages": chat}), 400, param="messages",
                 code="context_length_exceeded")
    with pytest.raises(openai.BadRequestError):
        live.client().completions.create(model=MODEL_ID, prompt=list(range(n_ctx + 1)))


def raw_request(live, head, body=b""):
    """Send a request by hand (a server may answer before the body is sent); the status."""
    host, port = httpx.URL(live.url).host, httpx.URL(live.url).port
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(head + b"\r\n" + body)
        answer = b""
        while not _complete(answer):
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer


def _complete(answer):
    head, _, body = answer.partition(b"\r\n\r\n")
    length = [line for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")]
    return bool(length) and len(body) >= int(length[0].split(b":")[1])


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


def test_a_100_mb_body_is_413(live):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n" % (100 << 20))
    status, answer = raw_request(live, head, b'{"prompt": "' + b"a" * 65536)
    assert status == 413 and b"request_too_large" in answer

    def chunks():          # no Content-Length: counted as it arrives
        yield b'{"prompt": "'
        for _ in range(100):
            yield b"a" * (1 << 20)
    r = httpx.post(live.url + "/v1/completions", content=chunks(),
                   headers={"content-type": "application/json"}, timeout=60)
    assert_error(r, 413, code="request_too_large")


def test_unknown_routes_and_methods_answer_in_the_schema(live):
    assert_error(httpx.get(live.url + "/v1/nothing"), 404, type="not_found_error")
    assert_error(httpx.get(live.url + "/v1/completions"), 405)


def test_after_all_that_the_scheduler_serves_and_nothing_was_a_500(live):
    r = post(live, "/v1/completions", GOOD)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    statuses = {key for key in metrics(live.url) if key.startswith("ggml_server_http_requests_total")}
    assert not [key for key in statuses if 'status="5' in key]


def test_the_api_key():
    live = LiveServer(bundled_llama(n_seq_max=1, n_ctx=256), api_key="sekrit").wait_ready()
    try:
        assert_error(httpx.get(live.url + "/v1/models"), 401, type="authentication_error",
                     code="invalid_api_key")
        assert_error(httpx.post(live.url + "/v1/completions", json=GOOD,
                                headers={"Authorization": "Bearer wrong"}), 401,
                     type="authentication_error")
        assert_error(httpx.get(live.url + "/metrics"), 401, type="authentication_error")
        assert httpx.get(live.url + "/health").status_code == 200      # public, as llama.cpp's
        assert httpx.get(live.url + "/").status_code == 200            # the page asks for the key
        with pytest.raises(openai.AuthenticationError):
            live.client(api_key="wrong").models.list()
        r = live.client(api_key="sekrit").completions.create(model=MODEL_ID, prompt="ROMEO.",
                                                             max_tokens=2)
        assert r.usage.completion_tokens == 2
    finally:
        live.stop()


def _stream_in_thread(live, results):
    def run():
        with httpx.stream("POST", live.url + "/v1/completions", timeout=60,
                          json={"prompt": "ROMEO.", "max_tokens": 4, "stream": True}) as r:
            results.append((r.status_code, r.read()))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_past_the_queue_bound_the_answer_is_503():
    gate = Gate()      # closed: nothing finishes until the test has filled the queue
    live = LiveServer(gate.wrap(bundled_llama(n_seq_max=1, n_ctx=256)), max_queue=1).wait_ready()
    try:
        results = []
        threads = [_stream_in_thread(live, results) for _ in range(2)]
        wait_until(lambda: live.scheduler.admitted == 2, "two requests admitted")
        assert_error(post(live, "/v1/completions", GOOD), 503, type="unavailable_error",
                     code="server_overloaded")
        with pytest.raises(openai.InternalServerError) as caught:
            live.client().completions.create(model=MODEL_ID, prompt="ROMEO.", max_tokens=2)
        assert caught.value.status_code == 503
        assert_error(post(live, "/v1/completions", {**GOOD, "n": 3}), 400, param="n")
        gate.open()
        for thread in threads:
            thread.join(60)
        assert [status for status, _ in results] == [200, 200]
        assert all(body.rstrip().endswith(b"data: [DONE]") for _, body in results)
        assert post(live, "/v1/completions", GOOD).status_code == 200
    finally:
        gate.open()
        live.stop()


LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error",
                     "param": None}}


def test_503_while_the_model_loads_then_200():
    release = threading.Event()
    load = bundled_llama(n_seq_max=1, n_ctx=256)
    live = LiveServer(lambda: release.wait(60) and load())
    try:
        r = httpx.get(live.url + "/health")
        assert r.status_code == 503 and r.json() == LOADING
        assert_error(post(live, "/v1/completions", GOOD), 503, type="unavailable_error")
        assert httpx.get(live.url + "/v1/models").json()["data"][0]["id"] == MODEL_ID
        release.set()
        live.wait_ready()
        assert httpx.get(live.url + "/health").json() == {"status": "ok"}
        assert post(live, "/v1/completions", GOOD).status_code == 200
    finally:
        release.set()
        live.stop()


def test_a_model_that_fails_to_load_ends_the_server_with_status_1():
    def load():
        raise ValueError("model.gguf: not a GGUF file")
    live = LiveServer(load)
    live._thread.join(60)
    assert live.status == 1 and live.scheduler.state == "failed"


def test_an_error_in_a_route_is_a_500_in_the_schema_and_in_the_metrics():
    def load():
        llm = bundled_llama(n_seq_max=1, n_ctx=256)()

        def tokenize(*args, **kwargs):
            raise RuntimeError("a bug in a route")
        llm.tokenize = tokenize
        return llm
    live = LiveServer(load).wait_ready()
    try:
        assert_error(post(live, "/tokenize", {"content": "ROMEO."}), 500, type="server_error")
        counted = metrics(live.url)
        assert counted['ggml_server_http_requests_total{path="/tokenize",status="500"}'] == 1
        assert httpx.get(live.url + "/v1/models").status_code == 200     # and it goes on
    finally:
        live.stop()


def steps_through(wrap, n_seq_max):
    """A load() whose batches run each step as wrap(step)."""
    def load():
        llm = bundled_llama(n_seq_max=n_seq_max, n_ctx=256)()
        make = llm.batch

        def batch(*args, **kwargs):
            b = make(*args, **kwargs)
            b.step = wrap(b.step)
            return b
        llm.batch = batch
        return llm
    return load


def test_a_step_that_fails_is_a_500_for_its_requests_and_the_server_goes_on(capfd):
    failures = [RuntimeError("a bug in a step")]

    def failing(step):
        def failing_step():
            if failures:
                raise failures.pop()
            return step()
        return failing_step
    live = LiveServer(steps_through(failing, n_seq_max=2)).wait_ready()
    try:
        assert_error(post(live, "/v1/completions", GOOD), 500, type="server_error")
        assert "a bug in a step" in capfd.readouterr().err      # the traceback, for the log
        r = post(live, "/v1/completions", GOOD)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        assert live.scheduler.admitted == 0
    finally:
        live.stop()


def test_stopping_a_server_ends_its_open_streams_at_once():
    # a signal's shutdown ends them in sse-starlette; Server.stop() (a server in a thread)
    # must too, not leave them to uvicorn's graceful timeout
    def slow(step):
        def slow_step():
            time.sleep(0.05)
            return step()
        return slow_step
    live = LiveServer(steps_through(slow, n_seq_max=1)).wait_ready()
    lines, started = [], threading.Event()

    def stream():
        body = {"prompt": "ROMEO.", "max_tokens": 200, "stream": True}
        with httpx.stream("POST", live.url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                lines.append(line)
                started.set()
    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    assert started.wait(30)
    began = time.monotonic()
    live.stop()
    reader.join(30)
    assert not reader.is_alive() and time.monotonic() - began < TIMEOUT_GRACEFUL_S
    last = json.loads([line for line in lines if line.startswith("data: ")][-1][len("data: "):])
    assert last["error"]["type"] == "unavailable_error" and "shutting down" in last["error"]["message"]
