"""The HTTP side: routes, the API key and body-size guard, errors in OpenAI's schema.

Handlers check a request, turn its prompt into token ids (in a worker thread: long
prompts must not stall the event loop), submit one Job per sequence to the
scheduler and stream or gather what comes back. They never touch the model's
compute. A client that goes away (a closed stream, or a dropped connection while
a whole response is gathered) cancels its sequences.
"""
import asyncio
import contextlib
import hmac
import importlib.resources
import json
import os
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ggml_py.serve import params, responses
from ggml_py.serve.errors import APIError, bad_request
from ggml_py.serve.scheduler import Job
from ggml_py.tokenizer.chat_template import (
    ChatTemplateError,
    model_chat_template,
    render_chat,
)

MAX_BODY_BYTES = 16 << 20       # larger bodies get 413 (a 4096-token prompt is ~20 kB)
PUBLIC_PATHS = ("/", "/health", "/v1/health")     # answered without the API key
DISCONNECT_POLL_S = 0.25        # how often a gathered response checks its client is there


@dataclass(frozen=True)
class Settings:
    """What the server is told at start: the served model's name (and other names it
    answers to), the API key (None: none asked), a chat template source to use in
    place of the model's (None: the model's, else the default), the queue bound,
    a sequence's context (n_ctx_seq, context_shift) and whether requests share prompt
    prefixes (prefix_cache): see scheduler.Scheduler."""
    model_id: str
    aliases: tuple = ()
    api_key: str | None = None
    chat_template: str | None = None
    max_queue: int = 64
    max_body_bytes: int = MAX_BODY_BYTES
    n_ctx_seq: int | None = None
    context_shift: bool = False
    prefix_cache: bool = True


def model_names(path, aliases=()):
    """(model id, other names) of a served model file: the id is the first alias given,
    else the file's name without .gguf; the file's name and path are names too."""
    name = os.path.basename(path)
    model_id = aliases[0] if aliases else name.removesuffix(".gguf")
    return model_id, tuple(dict.fromkeys((name, path, *aliases[1:])))


def create_app(scheduler, metrics, settings):
    """The FastAPI app of a server whose model the scheduler owns."""
    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        scheduler.stop()      # at shutdown: what still runs is cancelled

    app = FastAPI(title="ggml-server", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    app.state.scheduler, app.state.settings = scheduler, settings
    routes = _Routes(scheduler, metrics, settings)

    @app.exception_handler(APIError)
    async def api_error(request, exc):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):     # unknown routes, wrong methods
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(APIError(exc.status_code, message, type=kind).body(),
                            status_code=exc.status_code)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request, exc):     # its body cut short: nobody to answer (499, as
        return Response(status_code=499)     # a client that leaves a stream: nginx's "closed")

    @app.exception_handler(Exception)
    async def server_error(request, exc):   # a bug: still OpenAI's schema
        body = APIError(500, f"internal error: {type(exc).__name__}: {exc}",
                        type="server_error").body()
        return JSONResponse(body, status_code=500)

    page = importlib.resources.files("ggml_py.serve").joinpath("page.html").read_text("utf-8")
    app.get("/", include_in_schema=False)(lambda: HTMLResponse(page))
    for path in ("/health", "/v1/health"):
        app.get(path)(routes.health)
    app.get("/metrics")(lambda: Response(metrics.text(), media_type=CONTENT_TYPE_LATEST))
    for path in ("/v1/models", "/models"):
        app.get(path)(routes.models)
    for path in ("/v1/models/{model_id:path}", "/models/{model_id:path}"):
        app.get(path)(routes.model)
    for path in ("/v1/completions", "/completions"):
        app.post(path)(routes.completions)
    for path in ("/v1/chat/completions", "/chat/completions"):
        app.post(path)(routes.chat)
    app.post("/tokenize")(routes.tokenize)
    app.post("/detokenize")(routes.detokenize)
    paths = {route.path for route in app.routes}
    app.add_middleware(Guard, api_key=settings.api_key, max_body=settings.max_body_bytes,
                       metrics=metrics, paths=paths)
    return app


class _Routes:
    def __init__(self, scheduler, metrics, settings):
        self.scheduler, self.metrics, self.settings = scheduler, metrics, settings
        self.names = {settings.model_id, *settings.aliases}
        self._template = None
        self._longest_piece = None   # characters of the vocabulary's longest token, at most

    # ---- facts ---------------------------------------------------------------

    async def health(self):
        """llama.cpp's: 200 {"status": "ok"} once loaded, 503 while loading."""
        self.scheduler.ready_llm()
        return {"status": "ok"}

    async def models(self):
        """The served model, as OpenAI lists models."""
        model = {"id": self.settings.model_id, "object": "model", "created": 0,
                 "owned_by": "ggml_py", "aliases": sorted(self.names - {self.settings.model_id})}
        if self.scheduler.state == "ready":
            llm = self.scheduler.llm
            model["meta"] = {"n_ctx": self.scheduler.n_ctx_seq, "n_ctx_pool": llm.n_ctx(),
                             "n_vocab": llm.n_vocab(), "n_seq_max": llm.n_seq_max()}
        return {"object": "list", "data": [model]}

    async def model(self, model_id: str):
        """The served model by its name or an alias, as OpenAI retrieves one (404 for
        another name)."""
        self._check_model(model_id)
        return (await self.models())["data"][0]

    # ---- tokens ----------------------------------------------------------------

    async def tokenize(self, request: Request):
        """llama.cpp's /tokenize: {content, add_special=false, parse_special=true,
        with_pieces=false} -> {tokens: [id] or [{id, piece}]} (a piece that is not whole
        UTF-8 is a list of its bytes)."""
        llm = self.scheduler.ready_llm()
        body = params.parse_json(await request.body())
        content = params.text_field(body, "content")
        add_special = params.get_bool(body, "add_special", False)
        parse_special = params.get_bool(body, "parse_special", True)
        with_pieces = params.get_bool(body, "with_pieces", False)
        ids = await run_in_threadpool(llm.tokenize, content, add_bos=add_special,
                                      special=parse_special)
        if not with_pieces:
            return {"tokens": ids}
        return {"tokens": [{"id": t, "piece": _piece(llm.tokenizer.token_to_piece(t))}
                           for t in ids]}

    async def detokenize(self, request: Request):
        """llama.cpp's /detokenize: {tokens} -> {content} (control tokens as their text)."""
        llm = self.scheduler.ready_llm()
        body = params.parse_json(await request.body())
        ids = _checked_ids(llm, params.token_list(body, "tokens"), "tokens")
        return {"content": llm.tokenizer.detokenize(ids, unparse_special=True)}

    # ---- generation ------------------------------------------------------------

    async def completions(self, request: Request):
        """POST /v1/completions."""
        self.scheduler.ready_llm()
        gen = params.completion(params.parse_json(await request.body()))
        return await self._generate(request, gen)

    async def chat(self, request: Request):
        """POST /v1/chat/completions."""
        self.scheduler.ready_llm()
        gen = params.chat(params.parse_json(await request.body()))
        return await self._generate(request, gen)

    def _check_model(self, name):
        if name is not None and name not in self.names:
            raise APIError(404, f"The model `{name}` does not exist; this server serves "
                                f"`{self.settings.model_id}`", param="model",
                           code="model_not_found")

    def _prompt_ids(self, llm, gen):
        """Token ids and echo text of each prompt (runs in a worker thread)."""
        if gen.chat:
            return [(self._chat_ids(llm, gen.prompts[0]), "")]
        out = []
        for prompt in gen.prompts:
            if isinstance(prompt, str):
                self._check_length(llm, prompt, "prompt")
                out.append((llm.tokenize(prompt, special=True), prompt if gen.echo else ""))
            else:
                ids = _checked_ids(llm, prompt, "prompt")
                out.append((ids, llm.tokenizer.detokenize(ids) if gen.echo else ""))
        return out

    def _chat_ids(self, llm, messages):
        tok = llm.tokenizer
        if self._template is None:
            self._template = (self.settings.chat_template or
                              model_chat_template(llm.model.file) or False)
        # OpenAI's "developer" is the system prompt of newer models: templates know "system"
        messages = [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages]
        bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
        try:
            text = render_chat(messages, self._template or None, bos_token=bos, eos_token=eos)
        except ChatTemplateError as exc:
            raise bad_request(str(exc), param="messages") from None
        self._check_length(llm, text, "messages")
        # a template that writes the BOS text itself must not get a second BOS
        return llm.tokenize(text, add_bos=not (bos and text.startswith(bos)), special=True)

    def _check_length(self, llm, text, param):
        """Refuse a text far past a sequence's context before tokenizing it (a body of
        16 MiB takes the tokenizer tens of seconds): no token is longer than the
        vocabulary's longest piece, so the text has at least (its characters) / that
        tokens - whitespace not counted, which some vocabularies' special tokens absorb."""
        if self._longest_piece is None:
            tok = llm.tokenizer
            self._longest_piece = max(1, max(len(tok.token_to_piece(i).decode("utf-8", "replace"))
                                             for i in range(llm.n_vocab())))
        n_ctx = self.scheduler.n_ctx_seq
        spaces = sum(map(text.count, " \t\n\r\v\f"))
        at_least = (len(text) - spaces) // self._longest_piece
        if at_least >= 2 * n_ctx:
            raise bad_request(f"This model's maximum context length is {n_ctx} tokens; the "
                              f"prompt has at least {at_least} tokens", param=param,
                              code="context_length_exceeded")

    async def _generate(self, request, gen):
        llm = self.scheduler.ready_llm()
        self._check_model(gen.model)
        prompts = await run_in_threadpool(self._prompt_ids, llm, gen)
        for ids, _ in prompts:
            if not ids:
                raise bad_request("the prompt is empty (and this vocabulary adds no BOS "
                                  "token)", param="prompt")
            n_ctx = self.scheduler.n_ctx_seq
            if len(ids) >= n_ctx:
                raise bad_request(f"This model's maximum context length is {n_ctx} "
                                  f"tokens; the prompt has {len(ids)} tokens",
                                  param="messages" if gen.chat else "prompt",
                                  code="context_length_exceeded")
        stream = _Stream(self.scheduler, llm, gen, prompts, self.settings.model_id)
        await stream.start()
        if gen.stream:
            return EventSourceResponse(stream.events(), sep="\n", ping=15)
        body = await stream.whole(request)
        # nobody reads it; 499 (nginx's "client closed request") counts it in /metrics
        return Response(status_code=499) if body is None else JSONResponse(body)


class _ClientGone(Exception):
    pass


class _Stream:
    """The sequences of one request: their jobs, and their events as they arrive."""

    def __init__(self, scheduler, llm, gen, prompts, model_id):
        self.scheduler, self.llm, self.gen = scheduler, llm, gen
        self.reply = responses.Reply(gen.chat, model_id)
        self.queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        # choice k = prompt i, sample j: k = i * n + j, as OpenAI numbers them
        self.jobs, self.echo, self.logprobs = [], [], []
        for ids, echo in prompts:
            for j in range(gen.n):
                k = len(self.jobs)
                self.jobs.append(Job(ids, gen.sampling.for_choice(j), self._deliverer(loop, k)))
                self.echo.append(echo)
                self.logprobs.append(responses.LogprobsFormat(llm.tokenizer, gen.chat,
                                                              text_offset=len(echo)))
        self.prompt_tokens = sum(len(ids) for ids, _ in prompts)
        self.generated = 0
        self.finished = set()
        self.early = []          # events that came while waiting for the others' "added"
        self._getter = None      # a queue.get() being waited for

    def _deliverer(self, loop, k):
        def deliver(event):      # called in the scheduler's thread
            try:
                loop.call_soon_threadsafe(self.queue.put_nowait, (k, event))
            except RuntimeError:    # the loop is closed: the server is gone
                pass
        return deliver

    async def start(self):
        """Submit the jobs and wait until the batch took them all (or refused one)."""
        self.scheduler.submit(self.jobs)
        waiting = set(range(len(self.jobs)))
        try:
            while waiting:
                k, event = await self.queue.get()
                if event[0] == "added":
                    waiting.discard(k)
                elif event[0] == "error":
                    raise event[1]
                else:
                    self.early.append((k, event))
        except BaseException:
            self.scheduler.cancel(self.jobs)
            raise

    async def _next(self):
        """The next (k, event), or None when none came within DISCONNECT_POLL_S (for the
        caller to look at its client and the shutdown)."""
        if self.early:
            return self.early.pop(0)
        self._getter = self._getter or asyncio.ensure_future(self.queue.get())
        done, _ = await asyncio.wait({self._getter}, timeout=DISCONNECT_POLL_S)
        if not done:
            return None
        event, self._getter = self._getter.result(), None
        return event

    def _stop_waiting(self):
        """The response is over: the pending get cancelled, and the jobs still running."""
        if self._getter is not None:
            self._getter.cancel()
        self.scheduler.cancel([j for k, j in enumerate(self.jobs) if k not in self.finished])

    def _done(self, k, event):
        self.finished.add(k)
        self.generated += event[3]
        return responses.finish_reason(event[1])

    async def events(self):
        """The SSE events of a stream (OpenAI chunks, then [DONE]); a stream the client
        closes cancels what is still running."""
        reply, gen = self.reply, self.gen
        try:
            for k in range(len(self.jobs)):
                if gen.chat:
                    yield json.dumps(reply.chunk(k, role=True))
                elif self.echo[k]:
                    yield json.dumps(reply.chunk(k, self.echo[k]))
            while len(self.finished) < len(self.jobs):
                # sse-starlette ends the streams on a signal, not on Server.stop() (a server
                # in a thread of its own): the shutdown's start ends them here
                if self.scheduler.draining_since is not None:
                    yield json.dumps(APIError(503, "the server is shutting down",
                                              type="unavailable_error").body())
                    return
                next_event = await self._next()
                if next_event is None:
                    continue
                k, event = next_event
                if event[0] == "piece":
                    logprobs = self.logprobs[k].format(event[2]) if gen.sampling.logprobs \
                        is not None else None
                    yield json.dumps(reply.chunk(k, event[1], logprobs=logprobs))
                elif event[0] == "done":
                    chunk = reply.chunk(k, finish_reason=self._done(k, event))
                    if len(self.finished) == len(self.jobs) and not gen.include_usage:
                        chunk["usage"] = responses.usage(self.prompt_tokens, self.generated)
                    yield json.dumps(chunk)
                elif event[0] == "error":
                    yield json.dumps(event[1].body())
                    return
            if gen.include_usage:
                yield json.dumps(reply.usage_chunk(self.prompt_tokens, self.generated))
            yield "[DONE]"
        finally:
            self._stop_waiting()

    async def whole(self, request):
        """The whole response, gathered; a client that disconnects meanwhile cancels it
        (and None is returned)."""
        texts = list(self.echo)
        parts = [[] for _ in self.jobs]
        reasons = [None] * len(self.jobs)
        checked = time.monotonic()
        try:
            while len(self.finished) < len(self.jobs):
                if time.monotonic() - checked >= DISCONNECT_POLL_S:   # (events may never pause)
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        raise _ClientGone
                if self.scheduler.drained():
                    raise APIError(503, "the server shut down before this request finished",
                                   type="unavailable_error")
                next_event = await self._next()
                if next_event is None:
                    continue
                k, event = next_event
                if event[0] == "piece":
                    texts[k] += event[1]
                    if self.gen.sampling.logprobs is not None:
                        parts[k].append(self.logprobs[k].format(event[2]))
                elif event[0] == "done":
                    reasons[k] = self._done(k, event)
                elif event[0] == "error":
                    raise event[1]
        except _ClientGone:
            return None
        finally:
            self._stop_waiting()
        choices = [(texts[k], reasons[k], responses.merge_logprobs(parts[k], self.gen.chat))
                   for k in range(len(self.jobs))]
        return self.reply.whole(choices, self.prompt_tokens, self.generated)


def _piece(raw):
    """A token's piece for /tokenize: its text, or its bytes where they are not whole UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _checked_ids(llm, ids, name):
    n_vocab = llm.n_vocab()
    bad = next((t for t in ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise bad_request(f"Invalid value for '{name}': token id {bad} is not in "
                          f"0..{n_vocab - 1}", param=name, code="invalid_value")
    return list(ids)


class Guard:
    """ASGI middleware in front of every route: the API key (401), the body size (413,
    from Content-Length at once, or counted as a chunked body arrives), and the
    responses counted by route and status for /metrics."""

    def __init__(self, app, api_key, max_body, metrics, paths):
        self.app, self.api_key, self.max_body = app, api_key, max_body
        self.metrics, self.paths = metrics, paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"] if scope["path"] in self.paths else "(other)"
        for prefix in ("/v1/models/", "/models/"):      # one label for every model's name
            if scope["path"].startswith(prefix) and prefix + "{model_id:path}" in self.paths:
                path = prefix + "(name)"
        started = False

        async def counted_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.http.labels(path=path, status=str(message["status"])).inc()
            await send(message)

        headers = dict(scope["headers"])
        if self.api_key is not None and scope["path"] not in PUBLIC_PATHS:
            given = headers.get(b"authorization", b"")
            expected = b"Bearer " + self.api_key.encode()
            if not hmac.compare_digest(given, expected):
                error = APIError(401, "Invalid API key: send it as 'Authorization: Bearer KEY'",
                                 type="authentication_error", code="invalid_api_key")
                return await _send_error(counted_send, error)
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await _send_error(counted_send, self._too_large())
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    raise self._too_large()
            return message
        try:
            await self.app(scope, limited_receive, counted_send)
        except Exception:
            # an error no handler inside took: Starlette's outermost layer answers it with
            # server_error's 500, out of this counter's reach, so it is counted here
            if not started:
                self.metrics.http.labels(path=path, status="500").inc()
            raise

    def _too_large(self):
        return APIError(413, f"the request body is larger than {self.max_body} bytes",
                        code="request_too_large")


async def _send_error(send, error):
    body = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
