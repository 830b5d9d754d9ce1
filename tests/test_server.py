"""ggml-server with the official openai client: completions and chat, streamed and whole,
on the bundled model, against ggml-main and the Python API."""
import subprocess
import sys

import httpx
import pytest
from server_harness import MODEL_ID, LiveServer, bundled_llama, metrics, server_env

from ggml_py.tokenizer.chat_template import render_chat

openai = pytest.importorskip("openai")

PROMPT = "ROMEO."


@pytest.fixture(scope="module")
def live():
    server = LiveServer(bundled_llama(n_seq_max=4, n_ctx=1024)).wait_ready()
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def client(live):
    return live.client()


@pytest.fixture(scope="module")
def llm():
    """The Python API's reference: what Llama.generate_batch gives for the same request."""
    return bundled_llama(n_seq_max=4, n_ctx=1024)()


def greedy(client, prompt=PROMPT, max_tokens=24, **kwargs):
    return client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=max_tokens,
                                     temperature=0, **kwargs)


def test_health_models_and_metrics(live, client):
    assert httpx.get(live.url + "/health").json() == {"status": "ok"}
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_ID]
    assert f"{MODEL_ID}.gguf" in models[0].aliases
    r = httpx.get(live.url + "/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    for name in ("tokens_per_second", "sequences_waiting", "kv_pages_used", "kv_pages_total",
                 "http_requests_total"):
        assert f"ggml_server_{name}" in r.text


def test_greedy_completion_equals_ggml_main(client, tmp_path):
    r = greedy(client, max_tokens=24)
    text = r.choices[0].text
    main = subprocess.run([sys.executable, "-m", "ggml_py.cli.main", "-p", PROMPT, "-n", "24",
                           "-t", "1", "--temp", "0"], check=False, capture_output=True, text=True,
                          cwd=tmp_path, env=server_env(), timeout=120)
    assert main.returncode == 0, main.stderr
    assert main.stdout == PROMPT + text + "\n"
    assert r.object == "text_completion" and r.model == MODEL_ID and r.id.startswith("cmpl-")
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 24 and r.usage.total_tokens == 24 + r.usage.prompt_tokens


def test_streamed_completion_is_the_same_text_in_chunks_with_usage_at_the_end(client):
    whole = greedy(client, max_tokens=20)
    chunks = list(greedy(client, max_tokens=20, stream=True))
    assert len(chunks) > 2 and len({c.id for c in chunks}) == 1
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks][-2:] == [None, "length"]
    assert chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    usage_asked = list(greedy(client, max_tokens=5, stream=True,
                              stream_options={"include_usage": True}))
    assert usage_asked[-1].choices == [] and usage_asked[-1].usage.completion_tokens == 5


def test_chat_is_the_completion_of_the_rendered_conversation(client):
    messages = [{"role": "system", "content": "Speak verse."},
                {"role": "user", "content": "Who is there?"}]
    # the bundled model has no template of its own: the default transcript
    expected = greedy(client, prompt=render_chat(messages), max_tokens=16).choices[0].text
    r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=16,
                                       temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected
    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=messages,
                                                 max_tokens=16, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 16 == r.usage.completion_tokens


def test_a_seed_gives_the_same_text_twice_and_the_text_generate_batch_gives(client, llm):
    def sampled(seed, n_tokens=32):
        return client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=n_tokens,
                                         temperature=1.0, top_p=1.0, seed=seed).choices[0].text
    first = sampled(7)
    assert sampled(7) == first
    assert first == llm.generate_batch([PROMPT], max_tokens=32, temperature=1.0, top_p=1.0,
                                       seed=7)[0]
    assert any(sampled(seed) != first for seed in (8, 9, 10))


def test_n_choices_take_seed_plus_index_and_count_in_usage(client):
    r = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=12, temperature=1.0,
                                  seed=7, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    alone = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=12,
                                      temperature=1.0, seed=8)
    assert r.choices[1].text == alone.choices[0].text
    assert r.usage.completion_tokens == 36


def test_several_prompts_number_their_choices_prompt_by_prompt(client):
    r = greedy(client, prompt=[PROMPT, "JULIET."], max_tokens=8, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text == greedy(client, max_tokens=8).choices[0].text
    assert r.choices[3].text == greedy(client, prompt="JULIET.", max_tokens=8).choices[0].text


def test_a_stop_string_ends_the_text_before_it(client):
    text = greedy(client, max_tokens=40).choices[0].text
    stop = text[12:16]
    assert stop.strip(), text
    r = greedy(client, max_tokens=40, stop=[stop, "never in this text"])
    assert r.choices[0].text == text[:text.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = greedy(client, max_tokens=40, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == text[:text.index(stop)]


def test_completion_logprobs(client):
    r = greedy(client, max_tokens=10, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 10
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(10)]
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 3 and chosen <= 0
        assert chosen == pytest.approx(max(top.values()))     # greedy: the most likely one
    streamed = list(greedy(client, max_tokens=10, logprobs=3, stream=True))
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs
              for t in c.choices[0].logprobs.tokens]
    assert tokens == lp.tokens


def test_logprobs_end_with_the_text_a_stop_string_leaves(client):
    text = greedy(client, max_tokens=40).choices[0].text
    stop = text[12:16]
    r = greedy(client, max_tokens=40, stop=[stop], logprobs=1)
    kept, tokens = r.choices[0].text, r.choices[0].logprobs.tokens
    assert kept == text[:text.index(stop)]
    assert "".join(tokens).startswith(kept) and len("".join(tokens[:-1])) < len(kept)
    streamed = list(greedy(client, max_tokens=40, stop=[stop], logprobs=1, stream=True))
    assert [t for c in streamed if c.choices and c.choices[0].logprobs
            for t in c.choices[0].logprobs.tokens] == tokens


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)
    assert bytes(b for c in content for b in c.bytes).decode() == r.choices[0].message.content


def test_echo_and_token_id_prompts(live, client):
    text = greedy(client, max_tokens=8).choices[0].text
    assert greedy(client, max_tokens=8, echo=True).choices[0].text == PROMPT + text
    ids = httpx.post(live.url + "/tokenize", json={"content": PROMPT, "add_special": True}).json()
    r = greedy(client, prompt=ids["tokens"], max_tokens=8)
    assert r.choices[0].text == text and r.usage.prompt_tokens == len(ids["tokens"])


def test_tokenize_and_detokenize(live, llm):
    content = "ROMEO. What light through yonder window breaks?"
    tokens = httpx.post(live.url + "/tokenize", json={"content": content}).json()["tokens"]
    assert tokens == llm.tokenize(content, add_bos=False, special=True)
    with_bos = httpx.post(live.url + "/tokenize",
                          json={"content": content, "add_special": True}).json()["tokens"]
    assert with_bos == [llm.token_bos()] + tokens
    pieces = httpx.post(live.url + "/tokenize",
                        json={"content": content, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens and "".join(p["piece"] for p in pieces) == content
    back = httpx.post(live.url + "/detokenize", json={"tokens": tokens})
    assert back.json() == {"content": content}
    bad = httpx.post(live.url + "/detokenize", json={"tokens": [1, 999999]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_the_model_answers_to_its_aliases(client):
    r = client.completions.create(model=f"{MODEL_ID}.gguf", prompt=PROMPT, max_tokens=2)
    assert r.model == MODEL_ID


def test_requests_are_counted_by_route_and_status(live):
    before = metrics(live.url).get('ggml_server_http_requests_total{path="/tokenize",status="200"}', 0)
    httpx.post(live.url + "/tokenize", json={"content": "a"})
    after = metrics(live.url)
    assert after['ggml_server_http_requests_total{path="/tokenize",status="200"}'] == before + 1
    assert after["ggml_server_kv_pages_total"] == 1024 // 16 or after["ggml_server_kv_pages_total"] > 0
