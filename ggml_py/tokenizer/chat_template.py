"""Chat messages to a prompt, with a model's chat template as Hugging Face renders it.

A GGUF file may carry its model's template (`tokenizer.chat_template`, a jinja2
source copied from the model's `tokenizer_config.json`). It is rendered the way
`transformers`' `apply_chat_template` renders it, so that the prompt is the text the
model was trained on: a sandboxed, immutable jinja2 environment (a template is data
from a downloaded file: it must not reach Python objects or change the messages),
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, the `{% generation %}`
block (transformers' marker of the assistant's text for training masks: rendered as its
contents), the globals
`raise_exception(message)` and `strftime_now(format)`, a `tojson` filter that keeps
non-ASCII text, and the variables `messages`, `add_generation_prompt`, `bos_token`,
`eos_token` (plus any extra ones given). A model without a template gets
DEFAULT_TEMPLATE, a plain transcript ("User: ...", "Assistant:").

    prompt = render_chat([{"role": "user", "content": "Hi"}], template,
                         bos_token="<s>", eos_token="</s>")

Messages are checked first: a list of mappings, each with a non-empty string `role`
and a `content` that is a string, None (an assistant turn that only calls tools)
or a list of text parts ({"type": "text", "text": "..."}, joined by newlines as
llama.cpp's and vLLM's servers join them). Anything else,
a template that cannot be compiled, or a template that refuses the conversation
(raise_exception: "roles must alternate") is a ChatTemplateError (a ValueError)
that says where.
"""
import datetime
import functools
import json
from collections.abc import Mapping

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# A transcript with the role names: for models trained without a chat format.
DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}: {{ message['content'] or '' }}{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """Messages a template cannot render (malformed, or refused by the template), or a
    template that cannot be compiled; the message says which and where."""


def render_chat(messages, template=None, bos_token="", eos_token="",
                add_generation_prompt=True, **variables):
    """The prompt text of chat `messages` rendered by `template` (a jinja2 source, as
    a GGUF's `tokenizer.chat_template`; None: DEFAULT_TEMPLATE).

    bos_token, eos_token: the texts of the model's BOS and EOS tokens, which many
    templates write into the prompt. add_generation_prompt: end with the start of
    the assistant's turn, for the model to continue. variables: more names the
    template may read (tools, documents, date_string ...), passed as they are.
    Raises ChatTemplateError (a ValueError) for malformed messages, a template
    that does not compile, or one that refuses the conversation.
    """
    checked = check_messages(messages)
    compiled = compile_template(DEFAULT_TEMPLATE if template is None else template)
    for name, value in (("bos_token", bos_token), ("eos_token", eos_token)):
        if not isinstance(value, str):
            raise TypeError(f"render_chat: {name} must be a str, got {type(value).__name__}")
    try:
        return compiled.render(messages=checked, bos_token=bos_token, eos_token=eos_token,
                               add_generation_prompt=bool(add_generation_prompt), **variables)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as exc:      # undefined names, sandbox refusals, syntax
        raise ChatTemplateError(f"chat template: {type(exc).__name__}: {exc}") from None
    except (TypeError, ValueError, ArithmeticError, LookupError, AttributeError,
            RecursionError) as exc:
        # the template's own code failing on these messages (`messages[0]` of none, a
        # macro that calls itself for ever ...)
        raise ChatTemplateError(f"chat template failed on these messages: "
                                f"{type(exc).__name__}: {exc}") from None


def check_messages(messages):
    """Copies of chat messages with each `content` a str (text parts joined) or None;
    ChatTemplateError naming the message and field for anything malformed."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, (list, tuple)):
        raise ChatTemplateError(f"messages must be a list of messages, got "
                                f"{type(messages).__name__}")
    if not messages:
        raise ChatTemplateError("messages must not be empty")
    return [_checked_message(i, m) for i, m in enumerate(messages)]


def _checked_message(i, message):
    where = f"messages[{i}]"
    if not isinstance(message, Mapping):
        raise ChatTemplateError(f"{where} must be an object with 'role' and 'content', got "
                                f"{type(message).__name__}")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        got = "nothing" if role is None else repr(role) if isinstance(role, str) else \
            type(role).__name__
        raise ChatTemplateError(f"{where}.role must be a non-empty string, got {got}")
    if "content" not in message:
        raise ChatTemplateError(f"{where} has no 'content'")
    checked = dict(message)
    checked["content"] = _content_text(where, message["content"])
    return checked


def _content_text(where, content):
    """A message's content as a str (or None): text parts joined by a newline, as llama.cpp's
    server (common_chat_msgs_to_json_oaicompat) and vLLM's join them for a template that
    takes a string."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise ChatTemplateError(f"{where}.content must be a string, null or a list of text "
                                f"parts, got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text":
            what = f"type {kind!r}" if isinstance(part, Mapping) else type(part).__name__
            raise ChatTemplateError(f"{where}.content[{j}] must be a text part "
                                    f"({{'type': 'text', 'text': ...}}), got {what}")
        if not isinstance(part.get("text"), str):
            raise ChatTemplateError(f"{where}.content[{j}].text must be a string")
        texts.append(part["text"])
    return "\n".join(texts)


class _GenerationTags(jinja2.ext.Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (AssistantTracker): it marks
    the assistant's text for return_assistant_tokens_mask and renders as its contents;
    templates of models fine-tuned with it (TRL, NeMo) carry it into their GGUF."""
    tags = {"generation"}

    def parse(self, parser):
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message):
    raise ChatTemplateError(f"the chat template refused the messages: {message}")


def _strftime_now(format):
    return datetime.datetime.now().strftime(format)


def _tojson(value, indent=None, separators=None, sort_keys=False, ensure_ascii=False):
    # jinja2's own tojson escapes HTML characters for web pages; a prompt wants JSON
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys,
                      ensure_ascii=ensure_ascii)


@functools.lru_cache(maxsize=16)
def compile_template(source):
    """A jinja2 template of a chat template's source, compiled once per source in the
    sandbox render_chat uses; ChatTemplateError with the line for a syntax error."""
    if not isinstance(source, str):
        raise TypeError(f"a chat template must be a str, got {type(source).__name__}")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, _GenerationTags])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template, line {exc.lineno}: {exc.message}") from None


def model_chat_template(model_file):
    """The chat template a model file carries (`tokenizer.chat_template`), or None.
    model_file: a files.gguf_reader.GGUFModelFile (a value that is not a string is
    its ModelLoadError)."""
    return model_file.get("tokenizer.chat_template", None, type=str)
