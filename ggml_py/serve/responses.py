"""OpenAI's response objects: completions and chat completions, whole and as stream chunks.

    text_completion        {"id": "cmpl-…", "object": "text_completion", "created", "model",
                            "choices": [{"index", "text", "logprobs", "finish_reason"}], "usage"}
    chat.completion        choices: [{"index", "message": {"role", "content"}, "logprobs",
                            "finish_reason"}]
    chat.completion.chunk  choices: [{"index", "delta": {"role"?, "content"?}, "logprobs",
                            "finish_reason"}]; a stream's chunks share one id

Logprobs: a completion's are {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
a chat's are {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}. A token is
named by its piece of text (bytes that are not whole UTF-8 characters show as U+FFFD).
"""
import time
import uuid


def new_id(prefix):
    """A response id, as OpenAI's: 'cmpl-…' or 'chatcmpl-…'."""
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens, completion_tokens):
    """The usage object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Reply:
    """The id, time and model that every object of one response carries."""

    def __init__(self, chat, model):
        self.chat, self.model = chat, model
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())

    def _object(self, kind, choices, **more):
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, **more}

    def chunk(self, index, text=None, finish_reason=None, logprobs=None, role=False):
        """One stream chunk of choice `index`: new text (chat: a delta, with the role in
        the first chunk), or its finish_reason."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else \
                ({} if text is None else {"content": text})
            choice = {"index": index, "delta": delta, "logprobs": logprobs,
                      "finish_reason": finish_reason}
            return self._object("chat.completion.chunk", [choice])
        choice = {"index": index, "text": text or "", "logprobs": logprobs,
                  "finish_reason": finish_reason}
        return self._object("text_completion", [choice])

    def usage_chunk(self, prompt_tokens, completion_tokens):
        """The last chunk of a stream asked for with stream_options.include_usage."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return self._object(kind, [], usage=usage(prompt_tokens, completion_tokens))

    def whole(self, choices, prompt_tokens, completion_tokens):
        """The response of a request without stream: choices are (text, finish_reason,
        logprobs) in index order."""
        if self.chat:
            out = [{"index": i, "message": {"role": "assistant", "content": text},
                    "logprobs": logprobs, "finish_reason": reason}
                   for i, (text, reason, logprobs) in enumerate(choices)]
            kind = "chat.completion"
        else:
            out = [{"index": i, "text": text, "logprobs": logprobs, "finish_reason": reason}
                   for i, (text, reason, logprobs) in enumerate(choices)]
            kind = "text_completion"
        return self._object(kind, out, usage=usage(prompt_tokens, completion_tokens))


def finish_reason(reason):
    """OpenAI's finish_reason of the batch's: stop and length are the same words; a
    sequence cancelled by the server (shutting down) reads as stopped."""
    return "length" if reason == "length" else "stop"


class LogprobsFormat:
    """Formats the batch's (token, logprob, [(token, logprob), ...]) entries of one choice."""

    def __init__(self, tokenizer, chat, text_offset=0):
        self.tokenizer, self.chat, self.offset = tokenizer, chat, text_offset

    def _piece(self, token):
        raw = self.tokenizer.token_to_piece(token)
        return raw, raw.decode("utf-8", "replace")

    def format(self, entries):
        """The logprobs object of these entries (None if there are none)."""
        if not entries:
            return None
        if self.chat:
            content = []
            for token, logprob, top in entries:
                raw, text = self._piece(token)
                content.append({"token": text, "logprob": logprob, "bytes": list(raw),
                                "top_logprobs": [self._chat_alt(t, lp) for t, lp in top]})
            return {"content": content, "refusal": None}
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token, logprob, top in entries:
            text = self._piece(token)[1]
            out["tokens"].append(text)
            out["token_logprobs"].append(logprob)
            out["top_logprobs"].append({self._piece(t)[1]: lp for t, lp in top})
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

    def _chat_alt(self, token, logprob):
        raw, text = self._piece(token)
        return {"token": text, "logprob": logprob, "bytes": list(raw)}


def merge_logprobs(parts, chat):
    """One logprobs object of a choice's streamed parts (for a response without stream)."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    if chat:
        return {"content": [c for p in parts for c in p["content"]], "refusal": None}
    return {key: [v for p in parts for v in p[key]] for key in parts[0]}
