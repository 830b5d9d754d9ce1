"""Concurrent requests on the batch: they share steps (the server's step metrics say so, not
a clock), each gets the text it gets when it is served alone, and a client that goes away
is cancelled and its KV pages go back to the pool; shared prompt prefixes (and what the
metrics count of them); a request without a token limit under context shift ends."""
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

NAMES = ["ROMEO", "JULIET", "HAMLET", "OPHELIA", "MACBETH", "BANQUO", "OTHELLO", "IAGO",
         "PROSPERO", "MIRANDA", "VIOLA", "OLIVIA", "BRUTUS", "CASSIUS", "PORTIA", "LEAR"]
N_TOKENS = 24
CANCELLED = 'ggml_server_sequences_total{finish_reason="cancelled"}'


def test_sixteen_streams_share_steps_and_each_gets_its_text_alone():
    gate = Gate()      # closed until all sixteen are in: then they must share steps
    live = LiveServer(gate.wrap(bundled_llama(n_seq_max=16, n_ctx=16 * 64))).wait_ready()
    try:
        prompts = [f"{name}." for name in NAMES]
        results = [None] * len(prompts)

        def client(i):
            chunks = list(live.client().completions.create(
                model=MODEL_ID, prompt=prompts[i], max_tokens=N_TOKENS, temperature=0,
                stream=True))
            results[i] = ("".join(c.choices[0].text for c in chunks if c.choices),
                          chunks[-1].choices[0].finish_reason, chunks[-1].usage)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        wait_until(lambda: live.scheduler.admitted == len(prompts), "all requests admitted")
        before = metrics(live.url)
        gate.open()
        for thread in threads:
            thread.join(120)
        after = metrics(live.url)

        client = live.client()
        for prompt, (text, reason, usage) in zip(prompts, results):
            alone = client.completions.create(model=MODEL_ID, prompt=prompt,
                                              max_tokens=N_TOKENS, temperature=0)
            assert text == alone.choices[0].text, prompt
            assert reason == alone.choices[0].finish_reason
            assert usage.completion_tokens == alone.usage.completion_tokens

        def delta(name):
            return after.get(name, 0) - before.get(name, 0)
        steps = delta("ggml_server_step_sequences_count")
        tokens = delta("ggml_server_generated_tokens_total")
        assert tokens == sum(r[2].completion_tokens for r in results)
        # far fewer steps than tokens: each step gave a token to many sequences
        assert steps < tokens / 4, (steps, tokens)
        above_8 = delta("ggml_server_step_sequences_count") - \
            delta('ggml_server_step_sequences_bucket{le="8.0"}')
        assert above_8 >= N_TOKENS // 2, "steps with more than 8 sequences in them"
        assert after["ggml_server_kv_pages_used"] == 0
    finally:
        gate.open()
        live.stop()


@pytest.fixture
def gated():
    gate = Gate()
    live = LiveServer(gate.wrap(bundled_llama(n_seq_max=2, n_ctx=512))).wait_ready()
    yield live, gate
    gate.open()
    live.stop()


def cancelled_and_freed(live, gate, n_cancelled):
    """Let the batch step one at a time until n_cancelled sequences were cancelled."""
    def done():
        gate.allow(1)
        m = metrics(live.url)
        return m.get(CANCELLED, 0) == n_cancelled and m["ggml_server_kv_pages_used"] == 0
    wait_until(done, "the cancelled sequence's pages to return")


def test_a_client_that_closes_its_stream_is_cancelled_and_its_pages_return(gated):
    live, gate = gated
    body = {"prompt": "ROMEO.", "max_tokens": 400, "stream": True}
    with httpx.stream("POST", live.url + "/v1/completions", json=body, timeout=60) as r:
        gate.allow(4)          # the prompt's step and three tokens, no more
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen == 3:
                # read while the stream is open: leaving iter_lines closes the connection
                # (httpx), and the cancel may then reach the scheduler before its 4th step
                assert metrics(live.url)["ggml_server_kv_pages_used"] > 0, "pages in use"
                break
    # closed mid-stream: the sequence (which may run 400 tokens) is cancelled instead
    cancelled_and_freed(live, gate, 1)
    assert live.scheduler.admitted == 0


def test_a_client_that_drops_a_whole_response_is_cancelled_too(gated):
    live, gate = gated
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(live.url + "/v1/completions", json={"prompt": "ROMEO.", "max_tokens": 400},
                   timeout=1.0)
    gone = 'ggml_server_http_requests_total{path="/v1/completions",status="499"}'
    wait_until(lambda: metrics(live.url).get(gone) == 1, "the server to see the client gone")
    cancelled_and_freed(live, gate, 1)


def test_a_system_prompt_sent_again_is_read_from_shared_pages():
    live = LiveServer(bundled_llama(n_seq_max=2, n_ctx=512)).wait_ready()
    try:
        client = live.client()
        system = ("You are a player of Shakespeare's company. Answer every question in verse, "
                  "as the characters of the plays would.")
        texts = []
        for question in ("Who is Romeo?", "Who is Romeo?", "Who is Juliet?"):
            before = metrics(live.url)
            r = client.chat.completions.create(model=MODEL_ID, max_tokens=12, temperature=0,
                                               messages=[{"role": "system", "content": system},
                                                         {"role": "user", "content": question}])
            after = metrics(live.url)
            texts.append((r.choices[0].message.content,
                          after.get("ggml_server_prompt_tokens_shared_total", 0)
                          - before.get("ggml_server_prompt_tokens_shared_total", 0)))
        assert texts[0][1] == 0                        # the first reads its whole prompt
        assert texts[1][1] >= 16 and texts[2][1] >= 16      # the others start on its pages
        assert texts[1][0] == texts[0][0]              # and give the same text
        assert metrics(live.url)["ggml_server_kv_pages_idle"] > 0
        # a salt keeps a user's pages to that user's requests
        for salt, found in (("alice", False), ("alice", True), ("bob", False)):
            before = metrics(live.url).get("ggml_server_prompt_tokens_shared_total", 0)
            client.chat.completions.create(
                model=MODEL_ID, max_tokens=2, temperature=0, extra_body={"cache_salt": salt},
                messages=[{"role": "system", "content": system},
                          {"role": "user", "content": "Who is Romeo?"}])
            after = metrics(live.url).get("ggml_server_prompt_tokens_shared_total", 0)
            assert (after > before) == found, salt
        for bad, message in ((3, "Invalid type for 'cache_salt'"), ("", "must not be empty")):
            with pytest.raises(openai.BadRequestError, match=message):
                client.completions.create(model=MODEL_ID, prompt="ROMEO.", max_tokens=2,
                                          extra_body={"cache_salt": bad})
    finally:
        live.stop()


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
