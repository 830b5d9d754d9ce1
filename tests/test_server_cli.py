"""The ggml-server program in a subprocess: it serves the bundled model with no -m, its
flags, SIGTERM (stop accepting, end what runs, exit 0), and one-line errors."""
import signal
import subprocess
import sys
import threading

import httpx
import pytest
from server_harness import WAIT_S, ServerProcess, server_env
from test_chat_template import LLAMA_2

openai = pytest.importorskip("openai")


def test_sigterm_ends_streams_and_the_server_exits_0(tmp_path):
    server = ServerProcess(["-np", "2", "-t", "1"], cwd=tmp_path).wait_ready()
    try:
        streamed = []
        started = threading.Event()

        def stream():
            body = {"prompt": "ROMEO.", "max_tokens": -1, "stream": True}
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
                try:
                    for line in r.iter_lines():
                        streamed.append(line)
                        started.set()
                except httpx.HTTPError:     # the server went: what came is what counts
                    pass
        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert started.wait(WAIT_S)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(WAIT_S) == 0, server.stderr()
        reader.join(WAIT_S)
        assert not reader.is_alive() and any(line.startswith("data: {") for line in streamed)
        with pytest.raises(httpx.ConnectError):       # no longer accepting
            httpx.get(server.url + "/health")
        assert "Traceback" not in server.stderr()
    finally:
        server.kill()


def test_flags_chat_template_api_key_and_alias(tmp_path):
    template = tmp_path / "llama2.jinja"
    template.write_text(LLAMA_2)
    server = ServerProcess(["-np", "1", "-t", "1", "-c", "512", "--chat-template", str(template),
                            "--api-key", "sekrit", "-a", "bard", "-a", "will", "--no-prefix-cache"],
                           cwd=tmp_path).wait_ready()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="sekrit", max_retries=0)
        model = client.models.list().data[0]
        assert model.id == "bard" and "will" in model.aliases
        assert model.meta["n_ctx_pool"] == 512 and model.meta["n_ctx"] == 256   # the training context
        messages = [{"role": "user", "content": "Speak."}]
        r = client.chat.completions.create(model="will", messages=messages, max_tokens=3)
        expected = httpx.post(server.url + "/tokenize", headers={"Authorization": "Bearer sekrit"},
                              json={"content": "<s>[INST] Speak. [/INST]"}).json()["tokens"]
        assert r.usage.prompt_tokens == len(expected)      # the template's BOS, not a second one
        long = "Speak, speak. " * 12                        # --no-prefix-cache: never shared
        for _ in range(2):
            client.completions.create(model="bard", prompt=long, max_tokens=1)
        shared = httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer sekrit"}).text
        assert "ggml_server_prompt_tokens_shared_total 0.0" in shared
        with pytest.raises(openai.BadRequestError, match="alternate"):
            client.chat.completions.create(model="bard", messages=messages * 2, max_tokens=3)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0).models.list()
    finally:
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(WAIT_S) == 0
        server.kill()


def run_server(*args, cwd):
    return subprocess.run([sys.executable, "-m", "ggml_py.cli.server", *args], check=False,
                          capture_output=True, text=True, cwd=cwd, env=server_env(),
                          timeout=WAIT_S)


@pytest.mark.parametrize("args, status, fragment", [
    (["-m", "no-such-model.gguf", "--port", "0"], 1, "no-such-model.gguf"),
    (["--chat-template", "no-such-template.jinja", "--port", "0"], 1, "no-such-template.jinja"),
    (["--port", "70000"], 2, "--port must be in 0..65535"),
    (["--max-queue", "-1"], 2, "--max-queue must be at least 0"),
    (["-np", "0"], 2, "must be at least 1"),
    (["-ngl", "99"], 2, "unrecognized argument '-ngl'"),
])
def test_errors_are_one_line(tmp_path, args, status, fragment):
    proc = run_server(*args, cwd=tmp_path)
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and fragment in errors[0], proc.stderr


def test_a_template_that_does_not_compile_is_refused_at_start(tmp_path):
    template = tmp_path / "bad.jinja"
    template.write_text("{% for m in messages %}")
    proc = run_server("--chat-template", str(template), cwd=tmp_path)
    assert proc.returncode == 1 and "chat template, line 1" in proc.stderr
