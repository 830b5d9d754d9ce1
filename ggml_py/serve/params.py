"""The bodies of /v1/completions and /v1/chat/completions, checked field by field.

Every field the server reads is checked for its type and range, and a bad one is an
APIError 400 in OpenAI's words ("Invalid type for 'max_tokens': expected an integer,
got a string") naming the field in `param`. Sampling defaults are llama.cpp's
(temperature 0.8, top_k 40, top_p 0.95, min_p 0.05); max_tokens defaults to 16 for
completions (OpenAI's) and to "until the end" (-1) for chat. Fields the server does
not know are ignored, as llama.cpp's server ignores them; fields it knows but cannot
honour (tools, logit_bias, a JSON response_format, penalties other than
repeat_penalty) are refused rather than silently dropped.
"""
import json
import math
from dataclasses import dataclass

from ggml_py.serve.errors import bad_request

MAX_N = 128                 # choices per request (OpenAI's limit)
MAX_STOPS = 16
MAX_LOGPROBS = 20           # top alternatives per token (chat's top_logprobs limit)
INT32_MAX = 2 ** 31 - 1
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


@dataclass(frozen=True)
class Sampling:
    """What one sequence is generated with: the keyword arguments of Batch.add."""
    max_tokens: int = 16          # -1: until end-of-generation or a full context
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None
    stop: tuple = ()
    logprobs: int | None = None
    cache_salt: str | None = None   # shares KV pages only with requests of the same salt

    def for_choice(self, i):
        """The settings of choice i of n: seed + i, so that choice 0 is what n=1 gives."""
        if self.seed is None or i == 0:
            return self
        return Sampling(**{**self.__dict__, "seed": self.seed + i})


@dataclass(frozen=True)
class Generation:
    """A checked completion or chat request. prompts: for completions a list of
    prompts, each a str or a list of token ids; for chat one list of messages."""
    chat: bool
    prompts: list
    n: int
    stream: bool
    include_usage: bool
    echo: bool
    sampling: Sampling
    model: str | None


def parse_json(raw):
    """The JSON object of a request body (bytes); 400 for invalid UTF-8, invalid JSON
    (NaN and Infinity included: JSON has no such numbers), a string with a lone surrogate
    escape (\ud800: no Unicode text, so nothing could be tokenized or sent back) or a
    value that is not an object."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"the request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise bad_request("the request body is not valid JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {_kind(body)}")
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad_request("the request body is not valid JSON text: a string holds a lone "
                          f"surrogate escape (\\u{ord(exc.object[exc.start]):04x})") from None
    return body


def _no_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def _kind(value):
    """How a message names a JSON value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _wrong_type(name, expected, value):
    return bad_request(f"Invalid type for '{name}': expected {expected}, got {_kind(value)}",
                       param=name, code="invalid_type")


def _out_of_range(name, bounds, value):
    return bad_request(f"Invalid value for '{name}': {value!r} is out of range: it must be "
                       f"{bounds}", param=name, code="invalid_value")


def get_int(body, name, default, low, high):
    """body[name] as an int in low..high (a missing or null field: default)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(name, "an integer", value)
    if not low <= value <= high:
        raise _out_of_range(name, f"in {low}..{high}", value)
    return value


def get_number(body, name, default, low, high):
    """body[name] as a float in [low, high] (a missing or null field: default)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong_type(name, "a number", value)
    if not (math.isfinite(value) and low <= value <= high):
        raise _out_of_range(name, f"between {low} and {high}", value)
    return float(value)


def get_bool(body, name, default, within=""):
    """body[name] as a bool (a missing or null field: default); within: the name of the
    object body is in ("stream_options."), for the error's param."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _wrong_type(within + name, "a boolean", value)
    return value


def completion(body):
    """The Generation of a /v1/completions body."""
    prompts = _prompts(body.get("prompt"))
    logprobs = get_int(body, "logprobs", None, 0, MAX_LOGPROBS)
    echo = get_bool(body, "echo", False)
    if echo and logprobs is not None:
        raise bad_request("echo with logprobs is not supported (the prompt's log "
                          "probabilities are not computed)", param="echo")
    if body.get("suffix") not in (None, ""):
        raise bad_request("suffix is not supported", param="suffix")
    return _generation(body, chat=False, prompts=prompts, max_tokens=16, logprobs=logprobs,
                       echo=echo)


def chat(body):
    """The Generation of a /v1/chat/completions body (messages checked here for their
    roles; their contents are checked when the template renders them)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _wrong_type("messages", "an array of messages", messages) if messages is not None \
            else bad_request("'messages' is required", param="messages")
    if not messages:
        raise bad_request("'messages' must not be empty", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"Invalid type for 'messages[{i}]': expected an object, got "
                              f"{_kind(m)}", param=f"messages[{i}]")
        if m.get("role") not in CHAT_ROLES:
            raise bad_request(f"Invalid value for 'messages[{i}].role': {m.get('role')!r}; "
                              f"supported: {', '.join(CHAT_ROLES)}", param=f"messages[{i}].role")
    for name in ("tools", "functions"):
        if body.get(name):
            raise bad_request(f"{name} are not supported by this server", param=name)
    if body.get("tool_choice") not in (None, "none", "auto"):
        raise bad_request("tool_choice is not supported by this server", param="tool_choice")
    logprobs = get_bool(body, "logprobs", False)
    top = get_int(body, "top_logprobs", None, 0, MAX_LOGPROBS)
    if top is not None and not logprobs:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    max_tokens = get_int(body, "max_completion_tokens", -1, -1, INT32_MAX)
    if max_tokens == 0:          # (also beside a max_tokens, which takes its place)
        raise _out_of_range("max_completion_tokens", "at least 1 (or -1: until the end)", 0)
    return _generation(body, chat=True, prompts=[messages], max_tokens=max_tokens,
                       logprobs=(top or 0) if logprobs else None, echo=False)


def _prompts(prompt):
    """A completion's prompt(s): a string, an array of token ids, or an array of either."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt is None:
        raise bad_request("'prompt' is required", param="prompt")
    if not isinstance(prompt, list):
        raise _wrong_type("prompt", "a string, an array of strings or an array of token ids",
                          prompt)
    if not prompt:
        raise bad_request("'prompt' must not be an empty array", param="prompt")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [prompt]
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool)
                                             for t in p) for p in prompt):
        return list(prompt)
    raise bad_request("Invalid type for 'prompt': expected a string, an array of strings, an "
                      "array of token ids or an array of such arrays", param="prompt",
                      code="invalid_type")


def _generation(body, chat, prompts, max_tokens, logprobs, echo):
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _wrong_type("model", "a string", model)
    for name in ("presence_penalty", "frequency_penalty"):
        if get_number(body, name, 0.0, -2.0, 2.0) != 0.0:
            raise bad_request(f"{name} is not supported by this server (repeat_penalty is)",
                              param=name)
    if body.get("logit_bias"):
        raise bad_request("logit_bias is not supported by this server", param="logit_bias")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise bad_request("response_format other than {'type': 'text'} is not supported by "
                          "this server", param="response_format")
    n = get_int(body, "n", 1, 1, MAX_N)
    best_of = get_int(body, "best_of", n, 1, MAX_N)
    if best_of != n:
        raise bad_request("best_of other than n is not supported", param="best_of")
    stream = get_bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _wrong_type("stream_options", "an object", options)
    include_usage = get_bool(options or {}, "include_usage", False, within="stream_options.")
    seed = get_int(body, "seed", None, -1, 2 ** 63 - 1)
    sampling = Sampling(
        max_tokens=get_int(body, "max_tokens", max_tokens, -1, INT32_MAX),
        temperature=get_number(body, "temperature", 0.8, 0.0, 2.0),
        top_k=get_int(body, "top_k", 40, 0, INT32_MAX),
        top_p=get_number(body, "top_p", 0.95, 0.0, 1.0),
        min_p=get_number(body, "min_p", 0.05, 0.0, 1.0),
        repeat_penalty=get_number(body, "repeat_penalty", 1.0, 0.01, 100.0),
        seed=None if seed == -1 else seed,
        stop=_stops(body.get("stop")),
        logprobs=logprobs,
        cache_salt=_cache_salt(body.get("cache_salt")))
    if sampling.max_tokens == 0:
        raise _out_of_range("max_tokens", "at least 1 (or -1: until the end)", 0)
    return Generation(chat=chat, prompts=prompts, n=n, stream=stream,
                      include_usage=include_usage, echo=echo, sampling=sampling, model=model)


def _cache_salt(salt):
    if salt is None:
        return None
    if not isinstance(salt, str):
        raise _wrong_type("cache_salt", "a string", salt)
    if not salt:
        raise bad_request("cache_salt must not be empty", param="cache_salt")
    return salt


def _stops(stop):
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _wrong_type("stop", "a string or an array of strings", stop)
    if len(stops) > MAX_STOPS:
        raise bad_request(f"at most {MAX_STOPS} stop strings, got {len(stops)}", param="stop")
    if not all(stops):
        raise bad_request("stop strings must not be empty", param="stop")
    return tuple(stops)


def token_list(body, name):
    """body[name] as a list of token ids (ints) -- range-checked by the model later."""
    value = body.get(name)
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                              for t in value):
        raise _wrong_type(name, "an array of token ids", value)
    return value


def text_field(body, name):
    """body[name] as a str; 400 if missing or of another type."""
    value = body.get(name)
    if not isinstance(value, str):
        if value is None:
            raise bad_request(f"'{name}' is required", param=name)
        raise _wrong_type(name, "a string", value)
    return value

