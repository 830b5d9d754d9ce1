"""ggml-server: an OpenAI-compatible HTTP server (docs/server.md), with llama-server's flags.

The server itself is ggml_py/serve/; this is its flags and its model loading. It
binds and prints its address at once, loads the model in the scheduler's thread
(/health answers 503 until then), and stops on SIGTERM (exit 0) or Ctrl-C (130).
"""
import os
import sys

from ggml_py.cli.common import (
    ArgumentParser,
    add_model_arguments,
    console_script,
    kv_options,
    open_llama,
    positive_int,
    run,
    serving_rank,
    setup_tune,
)
from ggml_py.model.bundled import default_model_path
from ggml_py.model.config import DEFAULT_N_CTX

PROG = "ggml-server"


def build_parser():
    """ggml-server's flags: the shared model flags plus llama-server's serving flags."""
    p = ArgumentParser(prog=PROG, description="Serve a llama-architecture GGUF model over an "
                                              "OpenAI-compatible HTTP API, with a chat page at /.")
    add_model_arguments(p, ctx_default=DEFAULT_N_CTX)
    p.add_argument("-np", "--parallel", type=positive_int, default=4, metavar="N",
                   help="sequences generated at once (default: 4); without -c the KV pool holds "
                        "N contexts")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080,
                   help="port to listen on (default: 8080; 0: a free one, printed)")
    p.add_argument("--api-key", metavar="KEY", default=os.environ.get("GGML_SERVER_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $GGML_SERVER_API_KEY, "
                        "else none)")
    p.add_argument("--chat-template", metavar="FNAME",
                   help="a jinja2 chat template file, in place of the model's "
                        "tokenizer.chat_template")
    p.add_argument("-a", "--alias", action="append", default=[], metavar="NAME",
                   help="the model's name in the API (default: the file's name); again: "
                        "more names it answers to")
    p.add_argument("--context-shift", action="store_true",
                   help="a sequence that fills its context drops half of it and goes on "
                        "(default: it ends, finish_reason 'length')")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="compute every request's prompt whole (default: a prompt's beginning "
                        "held in the KV pages of an earlier request is read from there; "
                        "requests may set cache_salt to share only among themselves)")
    p.add_argument("--max-queue", type=int, default=64, metavar="N",
                   help="requests that may wait beyond -np before the server answers 503 "
                        "(default: 64)")
    return p


def log(message):
    """A line on stderr, flushed."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def main(argv=None):
    """Parse the flags, bind, and serve until stopped; the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_queue < 0:
        parser.error(f"--max-queue must be at least 0, got {args.max_queue}")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in 0..65535, got {args.port}")
    model = args.model or default_model_path()
    load_args = {"n_threads": args.threads, "n_batch": args.batch_size, **kv_options(args),
                 "use_mmap": args.use_mmap, "repack": args.repack, "n_seq_max": args.parallel,
                 "pool_contexts": args.parallel, "tp": args.tp, "tp_log": args.tp_log}
    if args.tp and serving_rank():
        # another rank of a split model: no HTTP, its share of rank 0's steps (then exits)
        open_llama(model, args.ctx_size, args.ctx_default, **load_args)
    try:
        from ggml_py.serve.app import Settings, model_names
        from ggml_py.serve.run import Server, bind, url_of
    except ImportError as e:
        raise ValueError(f"the server needs the `server` extra: pip install 'ggml_py[server]' "
                         f"({e})") from None
    from ggml_py.tokenizer.chat_template import compile_template
    template = None
    if args.chat_template is not None:
        try:
            with open(args.chat_template, encoding="utf-8") as f:
                template = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{args.chat_template}: cannot read the chat template ({e})") from None
        compile_template(template)     # a syntax error now, not at the first chat
    model_id, aliases = model_names(model, args.alias)
    settings = Settings(model_id=model_id, aliases=aliases, api_key=args.api_key,
                        chat_template=template, max_queue=args.max_queue,
                        context_shift=args.context_shift, prefix_cache=args.prefix_cache)

    def load():
        llm, warnings = open_llama(model, args.ctx_size, args.ctx_default, **load_args)
        for message in warnings:
            log(f"warning: {message}")
        setup_tune(llm, args, log)
        log(f"loaded {model}: a KV pool of {llm.n_ctx()} tokens, n_seq_max = "
            f"{llm.n_seq_max()}, n_threads = {llm.n_threads()}")
        return llm

    server = Server(load, settings, log=log)
    sock = bind(args.host, args.port)
    log(f"listening on {url_of(sock)} (model {model_id}, loading)")
    return server.run(sock)


@console_script
def cli(argv=None):
    """Entry point of the ggml-server console script."""
    return run(PROG, main, argv)


if __name__ == "__main__":
    sys.exit(cli())
