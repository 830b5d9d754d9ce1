"""ggml-main's conversation (-cnv) and interactive (-i, --interactive-first, -r) modes:
the terminal side (reading lines, colours, Ctrl-C) of a model.chat.Conversation.

As llama-cli: a reply streams to stdout; Ctrl-C stops it and returns to the input;
Ctrl-C at the input, or end of input (Ctrl-D), ends the program with the timings
(exit status 130 and 0). A line ending in '\\' goes on on the next line; one
ending in '/' is sent without its '/'.
"""
import os
import sys

from ggml_py.cli.common import process_escapes
from ggml_py.model.chat import ContextFullError, Conversation
from ggml_py.model.context_shift import kept_count
from ggml_py.tokenizer.chat_template import model_chat_template

# llama.cpp's console colours: the prompt yellow, the user's input bold green
YELLOW, GREEN, RESET = "\033[33m", "\033[1m\033[32m", "\033[0m"


class Terminal:
    """Where the conversation is shown and typed: stdout, stdin, colours when asked for
    and the terminal shows them, line editing (readline) when stdin is a terminal."""

    def __init__(self, color):
        self.color = color and sys.stdout.isatty() and os.environ.get("TERM", "") != "dumb"
        self.readline = False
        if sys.stdin.isatty():
            try:
                import readline  # noqa: F401  (input() edits lines and keeps a history with it)
                self.readline = True
            except ImportError:
                pass
        self.at_line_start = True

    def write(self, text, color=None):
        """Show text (in a colour, when colours are on), flushed at once."""
        if not text:
            return
        if color and self.color:
            text = color + text + RESET
        sys.stdout.write(text)
        sys.stdout.flush()
        self.at_line_start = text.endswith(("\n", "\n" + RESET))

    def end_line(self):
        """Start a new line unless at the start of one."""
        if not self.at_line_start:
            self.write("\n")

    def read(self, prompt=""):
        """One input: a line, or lines joined where a line ends with '\\'; a final '/'
        is dropped. Raises EOFError at the end of input, KeyboardInterrupt on Ctrl-C."""
        lines = []
        if prompt:     # the prompt is on the screen: at the end of input, its line is ended
            self.at_line_start = False
        while True:
            if self.color:     # readline must be told which characters take no room
                start, end = ("\001", "\002") if self.readline else ("", "")
                line = input(prompt + start + GREEN + end)
            else:
                line = input(prompt)
            if self.color:
                self.write(RESET)
            self.at_line_start = True
            prompt = ""
            if line.endswith("\\"):
                lines.append(line[:-1] + "\n")
                continue
            lines.append(line.removesuffix("/"))
            return "".join(lines)


def start(llm, args, params, prompt, log):
    """The Conversation of ggml-main's flags with its opening queued (chat: -sys and -p as
    the system and first user message; plain: the prompt with the BOS), and whether a
    reply comes before the first input. ValueError when the opening does not fit."""
    template = None
    if args.conversation:
        template = model_chat_template(llm.model.file)
        if template is None:
            log("main: warning: the model has no chat template (tokenizer.chat_template); "
                "using a plain transcript (User: ... / Assistant:)")
    # interactive, a full context shifts unless -n -2 (until it is full), as llama-cli's;
    # -r alone runs as the plain path does, shifting under -n -1 only
    interactive = args.interactive or args.interactive_first or args.conversation
    conv = Conversation(llm, params, chat=args.conversation, template=template,
                        reverse_prompts=args.reverse_prompt, ignore_eos=args.ignore_eos,
                        context_shift=args.n_predict != -2 if interactive else args.n_predict == -1)
    if args.conversation:
        if args.system_prompt:
            conv.add_message("system", args.system_prompt)
        if prompt:
            if not args.system_prompt:
                log("main: -p is the first user message in a conversation; a system "
                    "prompt is given with -sys")
            conv.add_message("user", prompt)
        reply_first = bool(prompt)
    else:
        conv.add_text(prompt, special=True)    # as llama-cli: special tokens parsed
        # as llama-cli, a prompt that ends with a reverse prompt is the user's cue at once
        cue = any(text and prompt.endswith(text) for text in args.reverse_prompt)
        reply_first = not args.interactive_first and not cue
    opening = conv.tokens
    if reply_first and not opening:
        raise ValueError("the prompt is empty (and this vocabulary adds no BOS token to start from)")
    if len(opening) >= llm.n_ctx():
        raise ValueError(f"the prompt has {len(opening)} tokens, the context {llm.n_ctx()}")
    conv.n_keep = kept_count(opening, args.keep, llm.token_bos(),
                             llm.n_ctx() if conv.context_shift else None)
    return conv, reply_first


def interactive_banner(args, log):
    """llama-cli's lines about the interactive mode (stderr)."""
    log("main: interactive mode on.")
    for text in args.reverse_prompt:
        log(f"Reverse prompt: '{text}'")
    log("== Running in interactive mode. ==")
    log(" - Press Ctrl+C to interject at any time.")
    log(" - Press Return to return control to the AI." if not args.conversation else
        " - An empty line sends nothing.")
    log(" - To return control without starting a new line, end your input with '/'.")
    log(" - If you want to submit another line, end your input with '\\'.")
    if args.conversation and not args.system_prompt:
        log(" - Not using system message. To change it, set a different value via -sys PROMPT")
    log("")


def run(llm, conv, reply_first, args, log):
    """Show the opening, then replies and inputs in turn until the end of input, Ctrl-C
    at the input, a full context or (not interactive: -r alone) the end of the first
    reply. Returns the exit status: 0, or 130 after Ctrl-C at the input."""
    term = Terminal(args.color)
    interactive = args.interactive or args.interactive_first or args.conversation
    budget = args.n_predict if args.n_predict >= 0 else -1
    display = llm.tokenizer.decoder(unparse_special=args.special, strip_leading_space=False)
    if args.display_prompt:
        term.write("".join(display.feed(t) for t in conv.tokens) + display.flush(), YELLOW)
    want_reply = reply_first
    if not want_reply and not interactive:     # -r alone, the prompt ending with it
        term.end_line()
        return 0
    while True:
        if want_reply:
            if not show_reply(term, conv, display, budget, interactive, log):
                log("main: context full, stopping")    # (-n -2, or input that cannot fit)
                return 0
            if not interactive:
                term.end_line()
                return 0
            if conv.stop == "eog" and not args.conversation and args.reverse_prompt:
                # as llama-cli: after the end of text, the first reverse prompt is the cue
                conv.add_text(args.reverse_prompt[0], special=True)
                term.write(args.reverse_prompt[0])
        if args.conversation:
            term.end_line()
            term.write("\n")
        try:
            text = term.read("> " if args.conversation else "")
        except EOFError:
            term.end_line()
            log("main: EOF by user")
            return 0
        except KeyboardInterrupt:
            term.end_line()
            log("main: interrupted")
            return 130
        if args.escape:
            text = process_escapes(text)
        if args.conversation:
            want_reply = bool(text)     # an empty line sends nothing
            if text:
                try:
                    conv.add_message("user", text)
                except ValueError as exc:     # the chat template refused the conversation
                    conv.drop_input()
                    log(f"main: {exc}; this input is dropped")
                    want_reply = False
        else:
            want_reply = True           # an empty line returns control to the model
            if text:
                conv.add_text(text)


def show_reply(term, conv, display, budget, interactive, log):
    """Stream one reply to the terminal; Ctrl-C stops it. False when the context is
    full (the reply stopped there, or the input did not fit what was left of it)."""
    tokens = None
    try:
        tokens = conv.reply(budget, interactive=interactive)
        for token in tokens:
            term.write(display.feed(token))
        term.write(display.flush())
    except ContextFullError as exc:
        log(f"main: {exc}; this input is dropped")
        return len(conv.tokens) + 1 < conv.llm.n_ctx()
    except KeyboardInterrupt:     # the reply stops here; what it generated is kept
        if tokens is not None:
            tokens.close()
        term.write(display.flush())
        term.end_line()
        return True
    if conv.stop == "context_full":
        term.end_line()
        return False
    if conv.stop != "reverse_prompt":
        term.end_line()
    return True
