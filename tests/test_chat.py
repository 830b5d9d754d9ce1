"""model.chat.Conversation: what each turn feeds, what the cache keeps, how a reply ends."""
import pytest

import ggml_py as gg
from ggml_py.model.chat import ContextFullError, Conversation
from ggml_py.model.sampling import SamplingParams
from ggml_py.tokenizer.chat_template import render_chat

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# llama-2's shape: the end of a turn is the EOS token's text, after a space
LLAMA2 = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
          "{{ '[INST] ' + m['content'] + ' [/INST]' }}{% else %}"
          "{{ ' ' + m['content'] + ' ' + eos_token }}{% endif %}{% endfor %}")


@pytest.fixture(scope="module")
def llm():
    return gg.Llama(n_threads=1)      # the bundled model: SentencePiece, BOS <s>, EOS </s>


def params(seed=1):
    return SamplingParams(seed=seed)


def test_each_turn_feeds_only_what_it_adds_and_the_cache_keeps_the_rest(llm):
    llm.reset()
    conv = Conversation(llm, params(), template=CHATML)
    system = conv.add_message("system", "Be brief.")
    user = conv.add_message("user", "Who art thou?")
    assert system[0] == llm.token_bos() and llm.token_bos() not in user
    assert conv.tokens == llm.tokenize(render_chat(conv.messages, CHATML), special=True)
    list(conv.reply(max_tokens=6))
    assert conv.stop == "n_predict"
    reply_ids = conv.tokens[-6:]
    before = llm.timings.prompt_tokens
    queued = conv.add_message("user", "Speak again.")
    # the cut reply is closed with the end-of-turn the template writes, then the message
    assert llm.detokenize(queued) == ("<|im_end|>\n<|im_start|>user\nSpeak again.<|im_end|>\n"
                                      "<|im_start|>assistant\n")
    assert conv.tokens[-len(queued) - 6:-len(queued)] == reply_ids     # the reply's own tokens
    list(conv.reply(max_tokens=6))
    # evaluated: the last token of the first reply (sampled, not yet evaluated) and the input
    assert llm.timings.prompt_tokens - before == len(queued) + 1
    assert llm.tokens == conv.tokens[:-1]
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant", "user"]


def test_a_reply_ended_by_the_model_is_closed_by_what_the_template_writes_after_it(llm):
    # a stand-in generate that ends the reply with the EOS token, as a chat model does
    eos = llm.token_eos()
    said = llm.tokenize("Good morrow", add_bos=False)

    def generate_tokens(ids, params, max_tokens, ignore_eos, yield_eog, **shift):
        assert yield_eog
        yield from said + [eos]
    for template, after in ((LLAMA2, "[INST] Again [/INST]"),
                            (None, "\nUser: Again\nAssistant:")):
        conv = Conversation(llm, params(), template=template)
        conv.add_message("user", "Hail")
        conv.llm = type("Stub", (), {"tokenizer": llm.tokenizer, "n_ctx": llm.n_ctx,
                                     "token_bos": llm.token_bos, "shift_log": [],
                                     "generate_tokens": staticmethod(generate_tokens)})()
        assert list(conv.reply()) == said + [eos]
        assert conv.stop == "eog" and conv.reply_text == "Good morrow" and conv.eog_text == "</s>"
        queued = conv.add_message("user", "Again")
        # the EOS the model wrote is not written again; the template's text after it is
        assert llm.detokenize(queued) == after
        assert conv.tokens[-len(queued) - 1] == eos
        assert conv.messages[1] == {"role": "assistant", "content": "Good morrow"}


def test_a_template_that_writes_the_history_otherwise_gets_the_conversation_again(llm):
    # a template that numbers the turns from the end writes every earlier turn anew
    template = "{% for m in messages %}{{ loop.revindex }}:{{ m['content'] }}\n{% endfor %}"
    conv = Conversation(llm, params(), template=template)
    conv.add_message("user", "Hail")
    list(conv.reply(max_tokens=3))
    conv.add_message("user", "Again")
    expected = render_chat(conv.messages, template)
    assert conv.tokens == llm.tokenize(expected)      # whole, with the BOS: no stale prefix


def test_input_that_does_not_fit_is_dropped_whole(llm):
    small = gg.Llama(n_ctx=64, n_threads=1)
    conv = Conversation(small, params(), template=CHATML, context_shift=False)
    conv.add_message("user", "Hail")
    list(conv.reply(max_tokens=2))
    tokens, messages = conv.tokens, [dict(m) for m in conv.messages]
    conv.add_message("user", "A question far too long " * 8)
    with pytest.raises(ContextFullError, match="do not fit the context of 64"):
        conv.reply()
    assert conv.tokens == tokens and conv.messages == messages    # the reply still open
    conv.add_message("user", "Short")
    assert conv.messages[-2]["role"] == "assistant"


def test_plain_mode_stops_at_a_reverse_prompt_and_appends_text_as_it_is(llm):
    llm.reset()
    conv = Conversation(llm, SamplingParams(temperature=0), chat=False, reverse_prompts=["\n"])
    opening = conv.add_text("ROMEO.", special=True)
    assert opening == llm.tokenize("ROMEO.")
    list(conv.reply(max_tokens=64))
    assert conv.stop == "reverse_prompt" and conv.reply_text.endswith("\n")
    assert "\n" not in conv.reply_text[:-1]
    n = len(conv.tokens)
    assert conv.add_text("Speak") == llm.tokenize("Speak", add_bos=False)
    assert len(conv.tokens) == n + len(llm.tokenize("Speak", add_bos=False))


def test_a_reverse_prompt_not_at_the_end_counts_only_outside_interactive_mode(llm):
    conv = Conversation(llm, params(), chat=False, reverse_prompts=["ab"])
    conv.reply_text = "xxab."
    assert not conv._ends_with_reverse_prompt(interactive=True)
    assert conv._ends_with_reverse_prompt(interactive=False)     # llama-cli's two characters


def test_a_reply_interrupted_keeps_what_it_generated(llm):
    llm.reset()
    conv = Conversation(llm, params(), template=CHATML)
    conv.add_message("user", "Hail")
    tokens = conv.reply()
    got = [next(tokens) for _ in range(3)]
    tokens.close()             # as Ctrl-C leaves it
    assert conv.stop is None and conv.tokens[-3:] == got
    queued = conv.add_message("user", "Again")
    assert llm.detokenize(queued).startswith("<|im_end|>")


def test_generate_can_yield_the_token_that_ends_it(llm, monkeypatch):
    from ggml_py.model.sampling import Sampler
    eos = llm.token_eos()
    for yield_eog, expected in ((True, [5, 6, eos]), (False, [5, 6])):
        draws = iter([5, 6, eos, 7])
        monkeypatch.setattr(Sampler, "sample", lambda self, logits, draws=draws: next(draws))
        assert list(llm.generate_tokens("ROMEO.", max_tokens=10, yield_eog=yield_eog)) == expected
    draws = iter([5, 6, eos])
    monkeypatch.setattr(Sampler, "sample", lambda self, logits, draws=draws: next(draws))
    # max_tokens counts the text's tokens: the end that would come after them is not drawn
    assert list(llm.generate_tokens("ROMEO.", max_tokens=2, yield_eog=True)) == [5, 6]


def test_keep_counts_as_llama_cli_for_the_generate_line():
    from ggml_py.model.context_shift import kept_count
    assert kept_count([1, 5, 6], 0, bos_id=1) == 1        # the BOS is always kept
    assert kept_count([1, 5, 6], 2, bos_id=1) == 3
    assert kept_count([1, 5, 6], -1, bos_id=1) == 3       # the whole prompt
    assert kept_count([5, 6], 9, bos_id=1) == 2


def test_a_message_the_template_refuses_leaves_the_conversation_as_it_was(llm):
    from ggml_py.tokenizer.chat_template import ChatTemplateError
    strict = ("{% for m in messages %}{% if m['content'] == 'curse' %}"
              "{{ raise_exception('no cursing') }}{% endif %}{{ m['content'] }}\n{% endfor %}")
    conv = Conversation(llm, params(), template=strict)
    conv.add_message("user", "Hail")
    list(conv.reply(max_tokens=2))
    tokens, messages = conv.tokens, list(conv.messages)
    with pytest.raises(ChatTemplateError, match="no cursing"):
        conv.add_message("user", "curse")
    conv.drop_input()
    assert conv.tokens == tokens and conv.messages == messages


def test_a_long_conversation_shifts_its_context_and_goes_on():
    """Replies and inputs past the context: the history after the kept system message is
    halved (as llama-cli), the conversation's tokens stay those the cache holds."""
    small = gg.Llama(n_ctx=96, n_threads=1)
    conv = Conversation(small, SamplingParams(temperature=0.8, seed=3), template=CHATML,
                        ignore_eos=True)
    conv.add_message("system", "Be brief.")
    conv.n_keep = len(conv.tokens)                      # as --keep -1 keeps the opening
    opening = conv.tokens
    said = 0
    for turn in range(6):
        conv.add_message("user", f"Question {turn}, and a few more words to read")
        said += len(list(conv.reply(max_tokens=40)))
        assert conv.stop == "n_predict"
        assert conv.tokens[:small.n_tokens] == small.tokens       # in step with the cache
        assert conv.tokens[:len(opening)] == opening               # the kept part stays
    assert said == 240 and len(small.shift_log) >= 3 and small.n_tokens < 96
    # without shifting, the same conversation stops at the full context
    small.reset()
    shifts = len(small.shift_log)
    stopping = Conversation(small, SamplingParams(temperature=0.8, seed=3), template=CHATML,
                            ignore_eos=True, context_shift=False)
    stopping.add_message("user", "Question 0, and a few more words to read")
    list(stopping.reply(max_tokens=100))
    assert stopping.stop == "context_full" and len(small.shift_log) == shifts
    assert len(stopping.tokens) == 96
