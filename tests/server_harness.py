"""What the server tests share: a server in a thread of the test process (port 0), a gate
that holds the batch's steps until a test lets them run, a ggml-server subprocess, and
reading /metrics."""
import os
import re
import subprocess
import sys
import threading
import time
import warnings

import httpx

import ggml_py as gg
from ggml_py.model.bundled import default_model_path
from ggml_py.serve.app import Settings, model_names
from ggml_py.serve.run import Server, bind, url_of

MODEL_ID = "shakespeare-5m-q8_0"
EXTRA_ENV = {}         # what subprocesses also get in their environment
WAIT_S = 60            # the longest a test waits for something that must happen


def bundled_llama(n_seq_max=4, n_ctx=1024):
    """A loader of the bundled model for a Server (one thread: two on a busy two-core
    machine are several times slower)."""
    def load():
        with warnings.catch_warnings():     # a pool past the training context: expected
            warnings.simplefilter("ignore", gg.TrainingContextWarning)
            return gg.Llama(n_ctx=n_ctx, n_seq_max=n_seq_max, n_threads=1)
    return load


class Gate:
    """Holds the batch's steps: each step takes a permit; open() lets all of them run.
    It wraps a loader: the Llama it loads gets a batch whose step() waits here."""

    def __init__(self, permits=0):
        self._permits = threading.Semaphore(permits)
        self._open = threading.Event()

    def allow(self, n):
        for _ in range(n):
            self._permits.release()

    def open(self):
        self._open.set()
        self.allow(1)           # (a step waiting now)

    def wrap(self, load):
        gate = self

        def gated_load():
            llm = load()
            make = llm.batch
            llm.batch = lambda *args, **kwargs: _GatedBatch(make(*args, **kwargs), gate)
            return llm
        return gated_load

    def wait(self):
        while not self._open.is_set():
            if self._permits.acquire(timeout=0.05):
                return


class _GatedBatch:
    def __init__(self, batch, gate):
        self._batch, self._gate = batch, gate

    def step(self):
        self._gate.wait()
        return self._batch.step()

    def __getattr__(self, name):
        return getattr(self._batch, name)


class LiveServer:
    """A Server on 127.0.0.1 (a free port) in a thread; stop() ends it."""

    def __init__(self, load=None, **settings):
        model_id, aliases = model_names(default_model_path())
        settings.setdefault("model_id", model_id)
        settings.setdefault("aliases", aliases)
        self.server = Server(load or bundled_llama(), Settings(**settings))
        sock = bind("127.0.0.1", 0)
        self.url = url_of(sock)
        self.status = None
        self._thread = threading.Thread(target=self._run, args=(sock,), daemon=True)
        self._thread.start()

    def _run(self, sock):
        self.status = self.server.run(sock)

    @property
    def scheduler(self):
        return self.server.scheduler

    def wait_ready(self):
        wait_until(lambda: self.scheduler.state != "loading", "the model to load")
        return self

    def stop(self):
        self.server.stop()
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "the server did not stop"
        return self.status

    def client(self, **kwargs):
        """The official openai client on this server (no retries: a test sees each answer)."""
        import openai
        kwargs.setdefault("api_key", "unused")
        return openai.OpenAI(base_url=self.url + "/v1", max_retries=0, **kwargs)


def wait_until(condition, what, timeout=WAIT_S):
    """Poll condition() until true; fail naming `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(0.02)


def metrics(url, headers=None):
    """The server's /metrics as {name{labels}: value}."""
    text = httpx.get(url + "/metrics", headers=headers).text
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_:]+(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m[1]] = float(m[2])
    return out


# subprocesses import the ggml_py the tests import (installed, or built in place)
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(gg.__file__)))


def server_env():
    """The environment of a subprocess: this ggml_py first on its path (and EXTRA_ENV)."""
    paths = [PACKAGE_PARENT, EXTRA_ENV.get("PYTHONPATH"), os.environ.get("PYTHONPATH")]
    return dict(os.environ, **{**EXTRA_ENV, "PYTHONPATH": os.pathsep.join(filter(None, paths))})


class ServerProcess:
    """`ggml-server ARGS --port 0` in a subprocess (cwd: a neutral folder); url once it
    printed where it listens."""

    def __init__(self, args, cwd):
        self.proc = subprocess.Popen([sys.executable, "-m", "ggml_py.cli.server", "--port", "0",
                                      *args], cwd=cwd, env=server_env(), text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines = []
        self.url = None
        found = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r"listening on (http://\S+)", line)
                if m:
                    self.url = m[1]
                    found.set()
            found.set()
        threading.Thread(target=read, daemon=True).start()
        found.wait(WAIT_S)

    def stderr(self):
        return "".join(self.lines)

    def wait_ready(self):
        assert self.url, f"the server printed no address: {self.stderr()}"
        wait_until(lambda: _status(self.url + "/health") == 200, "/health to answer 200")
        return self

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _status(url):
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return None
