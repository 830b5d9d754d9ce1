"""Running the server: bind, start the scheduler (which loads the model), serve, stop.

The socket is bound first and the address printed, so a client can poll /health
(503 until the model is loaded). SIGTERM and SIGINT stop the server gracefully:
uvicorn stops accepting, open streams are ended (their sequences cancelled), a
response being gathered has scheduler.DRAIN_S seconds to finish (else it is a 503),
then the scheduler cancels what is left. SIGTERM then exits 0; Ctrl-C ends as the other
programs' Ctrl-C (KeyboardInterrupt, for the caller to report). A model that
fails to load ends the server with exit status 1.
"""
import signal
import socket
import threading

import uvicorn

from ggml_py.serve.app import create_app
from ggml_py.serve.metrics import ServerMetrics
from ggml_py.serve.scheduler import Scheduler

TIMEOUT_GRACEFUL_S = 3
# longer than HTTP clients keep an idle connection (httpx: 5 s): a connection the server
# closed at the moment a client reuses it is a reset request
TIMEOUT_KEEP_ALIVE_S = 30


def bind(host, port):
    """A listening TCP socket on host:port (port 0: a free one); OSError if it cannot."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                flags=socket.AI_PASSIVE)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def url_of(sock):
    """http://host:port of a bound socket."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Server:
    """A server for one model: load() makes the gg.Llama (in the scheduler's thread).

    server = Server(load, settings); server.start(sock) in a thread of its own, or
    server.run(sock) in the main thread (with the signal handling described above).
    """

    def __init__(self, load, settings, log=None):
        self.settings, self.log = settings, log or (lambda message: None)
        self.metrics = ServerMetrics()
        self.scheduler = Scheduler(load, settings.max_queue, self.metrics,
                                   on_failure=self._load_failed, n_ctx_seq=settings.n_ctx_seq,
                                   context_shift=settings.context_shift,
                                   prefix_cache=settings.prefix_cache,
                                   on_ready=self._ready)
        self.metrics.attach(self.scheduler)
        self.app = create_app(self.scheduler, self.metrics, settings)
        config = uvicorn.Config(self.app, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=TIMEOUT_GRACEFUL_S,
                                timeout_keep_alive=TIMEOUT_KEEP_ALIVE_S, lifespan="on")
        self.uvicorn = _Uvicorn(config, on_exit=self.scheduler.drain)

    def _ready(self):
        s = self.scheduler
        self.log(f"ready: up to {s.n_ctx_seq} tokens a sequence"
                 f"{' (context shift)' if s.context_shift else ''}, "
                 f"{s.llm.n_seq_max()} sequence{'s' if s.llm.n_seq_max() != 1 else ''} at once, "
                 f"{s.max_queue} more may wait")

    def _load_failed(self, exc):
        self.log(f"error: {exc}")
        self.uvicorn.should_exit = True

    def run(self, sock):
        """Serve on sock until stopped; the exit status: 0, or 1 if the model did not load."""
        if threading.current_thread() is threading.main_thread():
            # uvicorn puts its own handlers in while it serves, then puts this one back and
            # raises the signal again: this one makes SIGTERM (then) a clean exit
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self.scheduler.start()
        self.uvicorn.run(sockets=[sock])
        self.scheduler.stop()
        return 1 if self.scheduler.state == "failed" else 0

    def _on_sigterm(self, signum, frame):
        self.uvicorn.should_exit = True

    def stop(self):
        """Ask a running server to stop (from another thread)."""
        self.scheduler.drain()
        self.uvicorn.should_exit = True


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, telling the scheduler when a signal starts the shutdown (so
    that responses being gathered stop waiting before uvicorn's timeout cuts them)."""

    def __init__(self, config, on_exit):
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig, frame):
        """uvicorn's signal handler, after telling the scheduler."""
        self._on_exit()
        super().handle_exit(sig, frame)
