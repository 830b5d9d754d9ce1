"""A conversation with a Llama: turns appended to one sequence whose K/V rows stay in
the cache, replies generated after them (ggml-main's -cnv, -i and -r).

    conv = Conversation(llm, SamplingParams(seed=1), template=model_chat_template(f))
    conv.add_message("system", "You are Hamlet.")
    conv.add_message("user", "To be?")
    for token in conv.reply(max_tokens=64):        # stop: conv.stop says why it ended
        ...

Chat mode renders the messages with the model's chat template (tokenizer/chat_template.py;
a model without one gets its plain transcript) and feeds only what a new message adds: the
rendering with it less the rendering without it, as llama-cli's common_chat_format_single,
after the end of the assistant's turn that the sequence lacks (what the template writes
after the reply's text, less the end-of-generation token the model already wrote). The
reply stays as the model's own tokens in the cache. Where the template writes the history
otherwise once a message is added, the whole conversation is tokenized again and
Llama.generate reuses the cached prefix they share. Plain mode (chat=False) appends text as
it is, as llama-cli's interactive mode does.
"""
import dataclasses

from ggml_py.tokenizer.chat_template import render_chat

# Why a reply ended (Conversation.stop); None while it runs, or after an interruption.
STOPS = ("eog", "reverse_prompt", "n_predict", "context_full")


class ContextFullError(ValueError):
    """Input that does not fit the positions left in the context (nothing of it is kept)."""


class Conversation:
    """One sequence of a Llama that grows turn by turn: inputs are queued
    (add_message in chat mode, add_text in plain mode) and evaluated by the next
    reply(), which generates after them and keeps what it generated.

    llm: a Llama (its cache holds the sequence); params: SamplingParams (reply k
    samples with seed + k, so that a fixed seed gives the same conversation again);
    chat: render messages with `template` (a jinja2 source; None: render_chat's
    default transcript); reverse_prompts: texts that end a reply where the generated
    text ends with one (llama-cli's -r; special-token texts count as text);
    ignore_eos: never end at an end-of-generation token. context_shift: when the context
    fills (during a reply, or with an input that does not fit), drop half of the history
    after the first n_keep tokens and go on, as llama-cli does; otherwise the reply ends
    ("context_full") and such input is refused (ContextFullError).
    """

    def __init__(self, llm, params, chat=True, template=None, reverse_prompts=(),
                 ignore_eos=False, context_shift=True):
        self.llm = llm
        self.context_shift = context_shift
        self._shifts_seen = len(llm.shift_log)
        self.params = params
        self.chat = chat
        self.template = template
        self.reverse_prompts = tuple(reverse_prompts)
        self.ignore_eos = ignore_eos
        tok = llm.tokenizer
        self._bos_text = _piece(tok, tok.bos_id)
        self._eos_text = _piece(tok, tok.eos_id)
        # what closes a reply the model did not end itself (llama-cli inserts it too)
        self._eot_text = _piece(tok, tok.eot_id if tok.eot_id is not None else tok.eos_id)
        # a reverse prompt that is one token (a special token's text) is also found by id
        self._reverse_ids = set()
        for text in self.reverse_prompts:
            ids = tok.tokenize(text, add_special=False, parse_special=True)
            if len(ids) == 1:
                self._reverse_ids.add(ids[0])
        self.messages = []      # chat mode: the messages the sequence holds
        # the sequence as chunks of ids, each appended whole, so that an interrupt never
        # leaves half of one
        self._chunks = []
        self._reply_open = False   # a reply that is not yet an assistant message
        # (chunks, messages, reply_open) before the input queued since the last reply
        self._before_input = None
        self.n_keep = 0         # the tokens a context shift keeps (context_shift.kept_count)
        self.replies = 0
        self.stop = None
        self.reply_text = ""    # the last reply's text (special tokens as their texts)
        self.eog_text = ""      # the text of the token that ended it, if one did

    # ---- the sequence -------------------------------------------------------------

    @property
    def tokens(self):
        """Every token id of the sequence, queued input included."""
        return [t for ids in self._chunks for t in ids]

    def _save(self):
        """Remember the state before the first input queued since the last reply."""
        if self._before_input is None:
            self._before_input = (list(self._chunks), list(self.messages), self._reply_open)

    def _queue(self, ids):
        self._chunks.append(tuple(ids))
        return list(ids)

    def add_text(self, text, special=False):
        """Queue text as it is (plain mode): tokenized with the BOS first when the
        sequence is empty; special: control-token texts ("<s>") become those tokens.
        Returns the ids queued."""
        self._save()
        first = not self._chunks
        return self._queue(self.llm.tokenizer.tokenize(text, add_special=first,
                                                       parse_special=special))

    def add_message(self, role, content):
        """Queue a chat message (chat mode): what the template writes for it after the
        messages before it (and, after a reply, the end of the assistant's turn the
        sequence lacks); a "user" message ends with the start of the assistant's turn.
        Returns the ids queued; ChatTemplateError (a ValueError) if the template
        refuses the messages."""
        self._save()
        bridge = self._close_reply()
        past = self.messages
        messages = past + [{"role": role, "content": content}]
        full = self._render(messages, role == "user")
        before = self._render(past, False) if past else ""
        self.messages = messages
        tok = self.llm.tokenizer
        if self._chunks and full.startswith(before):
            return self._queue(tok.tokenize(bridge + full[len(before):], add_special=False,
                                            parse_special=True))
        # the first text, or a template that writes the history otherwise once a message
        # is added: the whole conversation again (generate reuses the prefix still cached)
        self._chunks = []
        if not full:       # (a template that writes a system message only with a user's)
            return []
        if tok.add_bos and self._bos_text and full.startswith(self._bos_text):
            full = full[len(self._bos_text):]     # the template writes the BOS the tokenizer adds
        return self._queue(tok.tokenize(full, add_special=True, parse_special=True))

    def _render(self, messages, add_generation_prompt):
        return render_chat(messages, self.template, bos_token=self._bos_text,
                           eos_token=self._eos_text, add_generation_prompt=add_generation_prompt)

    def _close_reply(self):
        """Make the last reply an assistant message (its text, stripped); the text
        that ends the assistant's turn in the template and is not in the sequence yet
        (after an end-of-generation token, what the template writes after its text;
        after a reply cut short, the end-of-turn token's text too)."""
        if not (self.chat and self._reply_open):
            return ""
        self._reply_open = False
        content = self.reply_text.strip()
        prompt = self._render(self.messages, True)       # what the reply was generated after
        self.messages = self.messages + [{"role": "assistant", "content": content}]
        history = self._render(self.messages, False)
        rest = history[len(prompt):] if history.startswith(prompt) else None
        at = -1 if rest is None else rest.find(content)
        if at < 0 or rest[:at].strip():
            # a template that writes the reply otherwise: llama-cli's way, the end-of-turn
            # token after a cut reply, and the newline the history ends with
            return ("" if self.stop == "eog" else self._eot_text) + \
                ("\n" if history.endswith("\n") else "")
        end = rest[at + len(content):]
        if self.stop == "eog":
            ended = end.lstrip()
            return ended[len(self.eog_text):] if self.eog_text and \
                ended.startswith(self.eog_text) else end
        spaces = self.reply_text[len(self.reply_text.rstrip()):]   # generated, so fed already
        return end[len(spaces):] if spaces and end.startswith(spaces) else end

    def drop_input(self):
        """Forget the input queued since the last reply (it did not fit)."""
        if self._before_input is not None:
            self._chunks, self.messages, self._reply_open = self._before_input
            self._before_input = None

    # ---- replies ------------------------------------------------------------------

    def reply(self, max_tokens=-1, interactive=True):
        """Evaluate the queued input and generate a reply: an iterator of its token ids
        (the end-of-generation token that ends it included, as the history keeps it).

        Ends at an end-of-generation token, a reverse prompt, max_tokens (< 0: no
        limit) or a full context; self.stop says which (None if it was interrupted:
        what was generated is kept). Raises ContextFullError, before anything runs,
        when the sequence with its queued input does not fit the context (the input
        is dropped). interactive: a reverse prompt must end the text (as llama-cli;
        otherwise it may be followed by two more characters).
        """
        n_ctx = self.llm.n_ctx()
        if not self.tokens:
            raise ValueError("nothing to reply to: the conversation is empty")
        # room for the input: shift the cached history (the input stays whole)
        while self.context_shift and len(self.tokens) >= n_ctx and \
                self.llm.n_tokens > self.n_keep + 1 and self.llm.tokens == \
                self.tokens[:self.llm.n_tokens]:
            self.llm.shift_context(self.n_keep)
            self._apply_shifts()
        ids = self.tokens
        if len(ids) >= n_ctx:
            self.drop_input()
            had = len(self.tokens)
            raise ContextFullError(f"{had} tokens of conversation and {len(ids) - had} of "
                                   f"input do not fit the context of {n_ctx}")
        params = self.params
        if params.seed is not None and params.seed >= 0:
            params = dataclasses.replace(params, seed=(params.seed + self.replies) % 2**32)
        has_bos = ids[0] == self.llm.token_bos()
        tokens = self.llm.generate_tokens(ids, params, max_tokens=max_tokens,
                                          ignore_eos=self.ignore_eos, yield_eog=True,
                                          context_shift=self.context_shift,
                                          keep=max(0, self.n_keep - has_bos))
        self._before_input = None
        self.replies += 1
        self._reply_open = True
        self.stop, self.reply_text, self.eog_text = None, "", ""
        return self._reply(tokens, max_tokens, interactive)

    def _reply(self, tokens, max_tokens, interactive):
        tok = self.llm.tokenizer
        decoder = tok.decoder(unparse_special=True, strip_leading_space=False)
        n = 0
        try:
            for token in tokens:
                self._apply_shifts()       # the shifts generate made before this token
                if tok.is_eog(token):
                    self._chunks.append((token,))
                    self.eog_text = _piece(tok, token)
                    self.stop = "eog"
                    yield token
                    return
                self._chunks.append((token,))
                self.reply_text += decoder.feed(token)
                n += 1
                yield token
                if token in self._reverse_ids or self._ends_with_reverse_prompt(interactive):
                    self.stop = "reverse_prompt"
                    return
            self.stop = "n_predict" if 0 <= max_tokens <= n else "context_full"
        finally:
            tokens.close()
            self.reply_text += decoder.flush()   # bytes of a character left unfinished

    def _apply_shifts(self):
        """Drop from the sequence what the Llama's context shifts since the last call
        dropped from its cache (the same positions: the cache holds a prefix of it)."""
        log = self.llm.shift_log
        if self._shifts_seen == len(log):
            return
        flat = self.tokens
        for kept, dropped in log[self._shifts_seen:]:
            del flat[kept:kept + dropped]
        self._shifts_seen = len(log)
        self._chunks = [tuple(flat)] if flat else []

    def _ends_with_reverse_prompt(self, interactive):
        pad = 0 if interactive else 2
        for text in self.reverse_prompts:
            if self.reply_text.find(text, max(0, len(self.reply_text) - len(text) - pad)) >= 0:
                return True
        return False


def _piece(tok, token_id):
    """The text of a token (a special token's own text), or "" for None."""
    if token_id is None:
        return ""
    return tok.token_to_piece(token_id, special=True).decode("utf-8", "replace")
