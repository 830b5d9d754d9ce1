"""The scheduler thread: it alone loads and uses the model, and steps its batch.

HTTP handlers never touch the model. They submit Jobs (one per sequence: a prompt's
token ids and its Sampling) and cancel them; both are messages to this thread's
inbox, taken between steps. Each step, every sequence's new text goes back to its
handler through the Job's `deliver` callback (thread-safe: it hands the event to the
handler's event loop). Events, in order:

    ("added",)                                the sequence is in the batch
    ("piece", text, logprobs)                 new text (may be ""), and the
                                              (token, logprob, top) of new tokens
    ("done", finish_reason, n_prompt, n_gen)  the end: "stop", "length" or "cancelled"
    ("error", APIError)                       refused (instead of "added"), or failed

Admission is bounded: at most n_seq_max running plus max_queue waiting sequences
are admitted; past that submit() raises the 503 APIError at once, before anything
is queued. A cancelled sequence (its client went away) is cancelled in the batch at
the next step, so its KV pages return to the pool.
"""
import collections
import queue
import sys
import threading
import time
import traceback

from ggml_py.model.config import DEFAULT_N_CTX
from ggml_py.serve.errors import APIError, bad_request, loading, overloaded

RATE_WINDOW_S = 10.0      # tokens/s is measured over the steps of the last 10 seconds
DRAIN_S = 2.0             # at shutdown, what a response being gathered may still take


class Job:
    """One sequence of a request: what to generate and where its events go."""

    def __init__(self, prompt_ids, sampling, deliver):
        self.prompt_ids, self.sampling, self.deliver = prompt_ids, sampling, deliver
        self.sid = None           # the batch's sequence id, once added
        self.cancelled = False    # set by the handler's thread; read here
        self.n_tokens = 0         # generated tokens seen so far
        self.n_chars = 0          # text delivered so far
        self.n_logprobs = 0       # logprobs delivered so far


class Scheduler:
    """Owns the model (made by load() in this thread) and its Batch.

    load: a function returning a gg.Llama made with n_seq_max; called in the thread.
    max_queue: sequences that may wait beyond the n_seq_max running ones.
    metrics: a ServerMetrics (metrics.py) it reports steps and finishes to.
    on_failure: called with the exception if load() fails (the server then exits);
    on_ready: called once the model is loaded and the batch made.
    n_ctx_seq: the most tokens one sequence holds (None: the programs' context rule,
    the model's training context or 2048 if smaller, within the pool).
    context_shift: a sequence at its last slot of n_ctx_seq drops half its tokens and
    goes on (else it ends with finish_reason "length", as llama-server's default).
    prefix_cache: a request starts on the KV pages that hold its prompt's beginning
    (model/batch.py, share_prefix), among requests of the same cache_salt.
    """

    def __init__(self, load, max_queue, metrics, on_failure=None, n_ctx_seq=None,
                 context_shift=False, on_ready=None, prefix_cache=True):
        self._load, self.max_queue, self.metrics = load, max_queue, metrics
        self._on_failure, self._on_ready = on_failure, on_ready
        self.n_ctx_seq, self.context_shift = n_ctx_seq, context_shift
        self.prefix_cache = prefix_cache
        self.llm = self.batch = None
        self.state = "loading"        # then "ready", "failed" or "stopped"
        self.error = None
        self.capacity = None          # n_seq_max + max_queue, once loaded
        self._inbox = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._admitted = 0            # sequences submitted and not yet finished
        self._live = {}               # sid -> Job (in the batch, not finished)
        self.n_running = self.n_waiting = 0
        self.draining_since = None    # time.monotonic() of the shutdown's start
        self.pages_used = self.pages_total = self.pages_idle = 0
        self._shared_counted = 0      # the batch's shared prompt tokens already counted
        self._recent = collections.deque()    # (time, tokens) of recent steps
        self._thread = threading.Thread(target=self._main, name="ggml-server-scheduler",
                                        daemon=True)

    # ---- called from the HTTP side ---------------------------------------------

    def start(self):
        """Start the thread: it loads the model, then serves."""
        self._thread.start()

    def ready_llm(self):
        """The loaded Llama, for tokenizing; the 503 APIError while it loads."""
        if self.state == "ready" and self.draining_since is None:
            return self.llm
        if self.state == "loading":
            raise loading()
        raise APIError(503, f"the model failed to load: {self.error}" if self.state == "failed"
                       else "the server is shutting down", type="unavailable_error")

    def submit(self, jobs):
        """Queue jobs (all or none); the 503 APIError when the bound would be passed."""
        llm = self.ready_llm()
        with self._lock:
            if self.capacity is not None and len(jobs) > self.capacity:
                raise bad_request(f"this request asks for {len(jobs)} sequences; the server "
                                  f"takes at most {self.capacity} at a time", param="n")
            if self._admitted + len(jobs) > self.capacity:
                raise overloaded(self.capacity)
            self._admitted += len(jobs)
            self.n_waiting += len(jobs)
        self._inbox.put(("add", jobs))
        return llm

    def cancel(self, jobs):
        """Stop these jobs at the next step (those already finished are left alone)."""
        jobs = [job for job in jobs if not job.cancelled]
        for job in jobs:
            job.cancelled = True
        if jobs:
            self._inbox.put(("cancel", jobs))

    def drain(self):
        """The server is shutting down: refuse new work; responses being gathered have
        DRAIN_S seconds left (see drained)."""
        if self.draining_since is None:
            self.draining_since = time.monotonic()

    def drained(self):
        """Whether the shutdown's grace time is over (APIError 503 for whoever still waits)."""
        return self.draining_since is not None and \
            time.monotonic() - self.draining_since > DRAIN_S

    def stop(self, timeout=5.0):
        """Cancel everything and end the thread (waiting at most timeout seconds)."""
        if self.state != "failed":
            self.state = "stopped"
        self._inbox.put(("stop", None))
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def admitted(self):
        """Sequences submitted and not finished: running, waiting, or not yet taken in."""
        return self._admitted

    def tokens_per_second(self):
        """Generated tokens per second over the last RATE_WINDOW_S seconds."""
        now = time.monotonic()
        with self._lock:
            total = sum(n for t, n in self._recent if now - t <= RATE_WINDOW_S)
        return total / RATE_WINDOW_S

    # ---- the thread ------------------------------------------------------------

    def _main(self):
        try:
            llm = self._load()
            n_ctx_train = llm.config.n_ctx_train
            if self.n_ctx_seq is None:
                self.n_ctx_seq = min(llm.n_ctx(), DEFAULT_N_CTX,
                                     n_ctx_train if n_ctx_train > 0 else llm.n_ctx())
            self.batch = llm.batch(n_ctx_seq=self.n_ctx_seq, context_shift=self.context_shift,
                                   share_prefix=self.prefix_cache)
            self.pages_total = llm.kv_pages_total()
            self.llm = llm
        except BaseException as exc:      # noqa: BLE001 - reported, and the server exits
            self.state, self.error = "failed", exc
            if self._on_failure is not None:
                self._on_failure(exc)
            return
        self.capacity = self.llm.n_seq_max() + self.max_queue
        if self.state == "loading":       # (not stopped while it loaded)
            self.state = "ready"
            if self._on_ready is not None:
                self._on_ready()
        while self._serve_commands():
            if self._live:
                self._step()

    def _serve_commands(self):
        """Take the inbox's messages (waiting for one when nothing runs); False at stop."""
        commands = []
        if not self._live:
            commands.append(self._inbox.get())
        while True:
            try:
                commands.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for kind, jobs in commands:
            if kind == "stop":
                for job in list(self._live.values()):
                    self._cancel(job)
                return False
            for job in jobs:
                if kind == "add":
                    self._add(job)
                else:
                    self._cancel(job)
        self._count()
        return True

    def _add(self, job):
        if job.cancelled:
            return self._release(job, "cancelled", deliver=False)
        s = job.sampling
        max_tokens = s.max_tokens
        if max_tokens < 0 and self.context_shift:
            # a sequence that shifts never fills its context: without a limit, one that
            # never ends its text would hold its place for ever (llama-server's rule)
            n_ctx_train = self.llm.config.n_ctx_train
            limit = n_ctx_train if n_ctx_train > 0 else self.n_ctx_seq
            max_tokens = max(1, limit - len(job.prompt_ids))
        try:
            job.sid = self.batch.add(job.prompt_ids, max_tokens=max_tokens,
                                     temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                     min_p=s.min_p, repeat_penalty=s.repeat_penalty, seed=s.seed,
                                     stop=s.stop, logprobs=s.logprobs, cache_salt=s.cache_salt)
        except (ValueError, TypeError) as exc:     # what the batch refuses: the request's fault
            job.deliver(("error", bad_request(str(exc))))
            return self._release(job, None, deliver=False)
        self._live[job.sid] = job
        self.metrics.prompt_tokens.inc(len(job.prompt_ids))
        job.deliver(("added",))

    def _cancel(self, job):
        if job.sid is not None and job.sid in self._live:
            self.batch.cancel(job.sid)
            self._finish(job, self.batch.sequence(job.sid))

    def _step(self):
        t0 = time.perf_counter()
        try:
            events = self.batch.step()
        except Exception as exc:     # noqa: BLE001 - a bug, not a request's fault: say so
            traceback.print_exc(file=sys.stderr)
            error = APIError(500, f"generation failed: {type(exc).__name__}: {exc}",
                             type="server_error")
            for sid, job in list(self._live.items()):
                job.deliver(("error", error))
                del self._live[sid]
                try:            # (the batch may be as broken as its step)
                    self.batch.cancel(sid)
                    self.batch.forget(sid)
                except Exception:   # noqa: BLE001, S110 - the job is released all the same
                    pass
                self._release(job, "cancelled", deliver=False)
            self._count()
            return
        seconds = time.perf_counter() - t0
        pieces = collections.defaultdict(str)
        for sid, piece in events:
            pieces[sid] += piece
        advanced = generated = 0
        for sid, job in list(self._live.items()):
            seq = self.batch.sequence(sid)
            new = len(seq.tokens) - job.n_tokens
            if new:
                advanced += 1
                generated += new
                job.n_tokens = len(seq.tokens)
            self._deliver_text(job, seq, pieces.get(sid, ""))
            if seq.done:
                self._finish(job, seq)
        now = time.monotonic()
        with self._lock:
            self._recent.append((now, generated))
            while self._recent and now - self._recent[0][0] > RATE_WINDOW_S:
                self._recent.popleft()
        self.metrics.step(seconds, advanced, generated)
        self._count()

    def _deliver_text(self, job, seq, piece):
        """Send the new piece and logprobs; the text the sequence holds is what counts
        (a piece the step's events missed is made up from it)."""
        if job.n_chars + len(piece) < len(seq.text) and seq.done:
            piece = seq.text[job.n_chars:]
        logprobs = []
        if job.sampling.logprobs is not None:
            # a token's entry goes with its text: none while a stop string may take it
            n = len(seq.logprobs) if seq.done else seq.tokens_within(job.n_chars + len(piece))
            logprobs = seq.logprobs[job.n_logprobs:n]
            job.n_logprobs = max(job.n_logprobs, n)
        if piece or logprobs:
            job.n_chars += len(piece)
            job.deliver(("piece", piece, logprobs))

    def _finish(self, job, seq, deliver=True):
        del self._live[job.sid]
        self.batch.forget(job.sid)
        self._release(job, seq.finish_reason, deliver=deliver,
                      counts=(len(seq.prompt_tokens), len(seq.tokens)))

    def _release(self, job, reason, deliver=True, counts=(0, 0)):
        with self._lock:
            self._admitted -= 1
        if reason is not None:
            self.metrics.finished.labels(finish_reason=reason).inc()
        if deliver and not job.cancelled:
            job.deliver(("done", reason, *counts))

    def _count(self):
        """The gauges' numbers, after the commands or a step."""
        try:
            running = self.batch.running - self.batch.waiting
            self.pages_used = self.llm.kv_pages_used()
            self.pages_idle = self.llm.kv_pool().pages_idle
            self.metrics.prompt_tokens_shared.inc(self.batch.n_shared_tokens - self._shared_counted)
            self._shared_counted = self.batch.n_shared_tokens
        except Exception:       # noqa: BLE001 - gauges must not end the scheduler
            return
        with self._lock:
            self.n_running, self.n_waiting = running, self._admitted - running
