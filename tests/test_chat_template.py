"""Chat templates rendered as Hugging Face renders them (tokenizer/chat_template.py), on the
templates real models ship: ChatML, llama-2-chat and zephyr (their tokenizer_config.json
sources, as GGUF files carry them in tokenizer.chat_template)."""
import pytest

from ggml_py.tokenizer.chat_template import (
    DEFAULT_TEMPLATE,
    ChatTemplateError,
    check_messages,
    compile_template,
    model_chat_template,
    render_chat,
)

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")

LLAMA_2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}")

# zephyr's is written over several lines: trim_blocks and lstrip_blocks decide its newlines
ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

CONVERSATION = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Who are you?"}]
TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}


def test_chatml():
    assert render_chat(CONVERSATION, CHATML, **TOKENS) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert render_chat(CONVERSATION[:2], CHATML, add_generation_prompt=False) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")


def test_llama_2_puts_the_system_prompt_in_the_first_turn_and_the_special_tokens_around_turns():
    assert render_chat(CONVERSATION, LLAMA_2, **TOKENS) == (
        "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello. </s>"
        "<s>[INST] Who are you? [/INST]")


def test_llama_2_refuses_roles_that_do_not_alternate():
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render_chat(messages, LLAMA_2, **TOKENS)


def test_zephyr_newlines_as_hugging_face_renders_them():
    assert render_chat(CONVERSATION, ZEPHYR, **TOKENS) == (
        "<|system|>\nYou are terse.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello.</s>\n"
        "<|user|>\nWho are you?</s>\n<|assistant|>\n")


def test_the_default_template_is_a_transcript():
    assert render_chat(CONVERSATION, None) == render_chat(CONVERSATION, DEFAULT_TEMPLATE)
    assert render_chat(CONVERSATION[1:2]) == "User: Hi\nAssistant:"
    assert render_chat(CONVERSATION[:2], add_generation_prompt=False) == \
        "System: You are terse.\nUser: Hi\n"


def test_text_parts_are_joined_and_other_fields_reach_the_template():
    # joined by newlines, as llama.cpp's and vLLM's servers join them: "Hello" and "world"
    # do not run together into "Helloworld"
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                             {"type": "text", "text": "world"}], "name": "ann"}]
    assert render_chat(messages, "{{ messages[0].content }}|{{ messages[0].name }}") == \
        "Hello\nworld|ann"
    assert render_chat([{"role": "user", "content": [{"type": "text", "text": "x"}]}],
                       "{{ messages[0].content }}") == "x"
    assert render_chat([{"role": "user", "content": []}], "[{{ messages[0].content }}]") == "[]"
    assert check_messages([{"role": "assistant", "content": None}])[0]["content"] is None


@pytest.mark.parametrize("messages, where", [
    ("Hi", "must be a list"),
    ([], "must not be empty"),
    ([5], r"messages\[0\] must be an object"),
    ([{"content": "x"}], r"messages\[0\].role must be a non-empty string, got nothing"),
    ([{"role": 3, "content": "x"}], r"messages\[0\].role must be a non-empty string, got int"),
    ([{"role": "user", "content": "a"}, {"role": "user"}], r"messages\[1\] has no 'content'"),
    ([{"role": "user", "content": 5}], r"messages\[0\].content must be a string"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     r"messages\[0\].content\[0\] must be a text part"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}],
     r"messages\[0\].content\[0\].text must be a string"),
])
def test_malformed_messages_are_refused_saying_where(messages, where):
    with pytest.raises(ChatTemplateError, match=where):
        render_chat(messages, CHATML)


def test_the_sandbox_keeps_templates_from_python_internals_and_from_changing_the_messages():
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(ChatTemplateError, match="SecurityError|unsafe"):
        render_chat(messages, "{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        render_chat(messages, "{{ messages.append({'role': 'user', 'content': 'y'}) }}")
    assert messages == [{"role": "user", "content": "x"}]


def test_template_errors_say_what_and_where():
    with pytest.raises(ChatTemplateError, match="line 2"):
        compile_template("ok\n{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="refused the messages: no system"):
        render_chat([{"role": "user", "content": "x"}],
                    "{% if messages[0].role != 'system' %}{{ raise_exception('no system') }}{% endif %}")
    with pytest.raises(ChatTemplateError, match="failed on these messages"):
        render_chat([{"role": "user", "content": "x"}], "{{ messages[0].content + 1 }}")
    with pytest.raises(TypeError):
        render_chat([{"role": "user", "content": "x"}], 5)


def test_generation_blocks_render_their_contents_as_transformers_renders_them():
    # transformers' AssistantTracker tag, kept by templates of models fine-tuned with TRL's
    # assistant-only loss or NeMo: a ChatML one and its whitespace control
    template = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
                "{% if message['role'] == 'assistant' %}{% generation %}"
                "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
                "{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    assert render_chat(CONVERSATION[1:], template) == render_chat(CONVERSATION[1:], CHATML)
    assert render_chat(CONVERSATION[1:3], "{% for m in messages %}\n  {%- generation %}\n"
                       "{{ m.content }}\n  {% endgeneration -%}\n|{% endfor %}") == "Hi\n|Hello.\n|"
    # (both as transformers and llama-cpp-python's Jinja2ChatFormatter render them)
    assert compile_template("A\n   {%+ generation %}\n   X\n   {% endgeneration +%}\n   B"
                            ).render() == "A\n      X\n\n   B"
    with pytest.raises(ChatTemplateError, match="endgeneration"):
        compile_template("{% generation %}x")


def test_a_template_that_recurses_for_ever_is_a_template_error():
    template = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"
    with pytest.raises(ChatTemplateError, match="RecursionError"):
        render_chat([{"role": "user", "content": "x"}], template)


def test_tojson_keeps_text_as_it_is_and_strftime_now_is_there():
    messages = [{"role": "user", "content": "café <b>"}]
    assert render_chat(messages, "{{ messages[0].content | tojson }}") == '"café <b>"'
    assert render_chat(messages, "{{ strftime_now('%Y') | length }}") == "4"


def test_the_model_file_template():
    class File:
        def __init__(self, value):
            self.value = value

        def get(self, key, default, type):
            assert key == "tokenizer.chat_template" and type is str
            return default if self.value is None else self.value
    assert model_chat_template(File(CHATML)) == CHATML
    assert model_chat_template(File(None)) is None
