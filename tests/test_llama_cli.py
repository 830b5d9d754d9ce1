"""ggml-main, ggml-perplexity and ggml-bench model (and ggml-tune's output), end to end in
subprocesses."""
import argparse
import json
import math
import os
import re
import signal
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from llama_models import DATA, N_VOCAB, model_path, scratch_path, vocab

import ggml_py as gg
from ggml_py.cli.common import int_list, process_escapes, read_prompt_file, thread_list
from ggml_py.tools.random_model import RandomLlamaSpec, random_weights, write_random_llama
from ggml_py.tune.bench import bench

# Subprocesses import the ggml_py these tests import (installed, or built in place),
# from a neutral folder: a checkout's own ggml_py/ must not shadow an installed one.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(gg.__file__)))
ENV = dict(os.environ, PYTHONPATH=PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
CWD = tempfile.gettempdir()
TEXT_FILE = os.path.join(DATA, "ggml-vocab-llama-spm.gguf.inp")


def run(module, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, env=ENV, cwd=CWD, timeout=timeout)


def main(*args):
    return run("ggml_py.cli.main", *args)


def assert_one_line_error(proc, code=None):
    assert proc.returncode != 0 if code is None else proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0], proc.stderr
    return lines[0]


def test_main_generates_and_prints_timings():
    proc = main("-m", model_path("f32"), "-p", "Once upon a time", "-n", 12, "-s", 3, "-t", 2,
                "--temp", 0.7, "--top-k", 20, "--top-p", 0.9, "--min-p", 0.02,
                "--repeat-penalty", 1.1, "--repeat-last-n", 16, "-c", 128, "-b", 4,
                "--ignore-eos", "--verbose-prompt")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(" Once upon a time")
    err = proc.stderr
    assert "system_info: n_threads = 2" in err and "AVX2 =" in err
    assert re.search(r"load time = +\d+\.\d+ ms", err)
    assert re.search(r"prompt eval time = .* / +\d+ tokens .* ms per token, .* tokens per second", err)
    assert re.search(r"       eval time = .* / +11 runs .* tokens per second", err)
    assert "     1 -> '<s>'" in err                   # --verbose-prompt
    again = main("-m", model_path("f32"), "-p", "Once upon a time", "-n", 12, "-s", 3, "-t", 1,
                 "--temp", 0.7, "--top-k", 20, "--top-p", 0.9, "--min-p", 0.02,
                 "--repeat-penalty", 1.1, "--repeat-last-n", 16, "-c", 128, "--ignore-eos")
    assert again.stdout == proc.stdout             # same seed, same text


@pytest.mark.parametrize("kind", ["q4_0", "q4_k"])
def test_main_no_repack_prints_the_same_text(kind):
    """--no-repack keeps the file's layout (no interleaved copy): the same text, and the
    same as gg.Llama(repack=False) says it is."""
    args = ("-m", model_path(kind), "-p", "The cat", "-n", 8, "--temp", 0, "-c", 64, "--ignore-eos")
    packed, plain = main(*args), main(*args, "--no-repack")
    assert packed.returncode == 0 and plain.returncode == 0, plain.stderr
    assert plain.stdout == packed.stdout and packed.stdout.startswith(" The cat")
    llm = gg.Llama(model_path(kind), n_ctx=64, repack=False)
    assert llm.model.weights.layers[0].wq.rows8 is None
    assert gg.Llama(model_path(kind), n_ctx=64).model.weights.layers[0].wq.rows8 is not None


def test_main_greedy_equals_api():
    prompt_file = scratch_path("prompt.txt")
    with open(prompt_file, "w") as f:
        f.write("The cat")
    proc = main("-m", model_path("f32"), "-f", prompt_file, "-n", 8, "--temp", 0, "-c", 64,
                "-ctk", "f32", "--ignore-eos")
    llm = gg.Llama(model_path("f32"), n_ctx=64, kv_type="f32")
    expected = "".join(llm.generate("The cat", max_tokens=8, temperature=0, ignore_eos=True))
    assert proc.stdout == " The cat" + expected + "\n"


@pytest.mark.parametrize("args, fragment", [
    (["-m", "M", "--temp"], "expected one argument"),
    (["-m", "M", "-n", "many"], "-n/--n-predict: invalid predict_count value: 'many'"),
    (["-m", "M", "-t", "x"], "-t/--threads: invalid n_threads value: 'x'"),
    (["-m", "M", "-ctk", "q4"], "invalid choice"),
    (["-m", "M", "--no-such-flag"], "unrecognized arguments"),
    # llama.cpp's one-dash words, which argparse read as a one-letter flag and its value
    (["-m", "M", "-ngl", "99", "-p", "x"], "unrecognized argument '-ngl' (not read as '-n gl'"),
    (["-m", "M", "-fa", "-p", "x"], "unrecognized argument '-fa' (not read as '-f a'"),
    (["-m", "M", "-no-cnv"], "unrecognized argument '-no-cnv'"),
    (["-m", "M", "-xyz"], "unrecognized argument '-xyz' (see --help"),
    (["-m", "M", "-fa=1"], "unrecognized argument '-fa=1' (not read as '-f a=1'"),
    (["-m", "M", "-ngl99"], "unrecognized argument '-ngl99' (not read as '-n gl99'"),
    # refused when parsed: nothing loaded, nothing echoed
    (["-m", "M", "-t", "999"], "-t/--threads: thread count must be at most 256, got 999"),
    (["-m", "M", "--repeat-last-n", "-5"], "must be at least -1"),
    (["-m", "M", "--repeat-penalty", "0"], "--repeat-penalty: must be a positive number"),
    (["-m", "M", "--repeat-penalty", "nan"], "--repeat-penalty: expected a number, got 'nan'"),
    (["-m", "M", "--temp", "nan"], "--temp: expected a number"),
    (["-m", "M", "--top-p", "nan"], "--top-p: expected a number"),
    (["-m", "M", "--min-p", "nan"], "--min-p: expected a number"),
    (["-m", "M", "-c", "-5"], "-c/--ctx-size: must be at least 0"),
    (["-m", "M", "-s", "-2"], "-s/--seed: must be -1 (a random seed) or 0 or more, got -2"),
    (["-m", "M", "--temp", "-nan"], "--temp: expected a number, got '-nan'"),
    (["-m", "M", "-inf"], "unrecognized argument '-inf'"),
    (["-m", "", "-p", "x"], "-m/--model: expected a file name, got ''"),
    (["-m", "M", "-f", ""], "-f/--file: expected a file name, got ''"),
])
def test_main_bad_flags(args, fragment):
    args = [model_path("f32") if a == "M" else a for a in args]
    line = assert_one_line_error(main(*args), code=2)
    assert line.startswith("ggml-main: error:") and fragment in line


def test_one_dash_words_that_are_values_or_flags_are_taken():
    # a prompt, a glued number and a two-letter flag of our own are not refused
    proc = main("-m", model_path("f32"), "-p", "-fa", "-n2", "-ctk", "f32", "--temp", 0, "-c", 32)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(" -fa")              # the prompt, echoed
    # one-letter switches run together are switches (-e and -h: the help, status 0)
    from ggml_py.cli.main import build_parser
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["-eh"])
    assert info.value.code == 0
    # a subcommand's flags are its parser's to check
    proc = run("ggml_py.cli.bench", "model", "-ngl", "1")
    assert assert_one_line_error(proc, 2).startswith("ggml-bench model: error: unrecognized "
                                                     "argument '-ngl'")
    # and so are its unknown long flags (argparse let the program report them)
    proc = run("ggml_py.cli.bench", "model", "--bogus")
    assert assert_one_line_error(proc, 2) == "ggml-bench model: error: unrecognized arguments: --bogus"


def test_negative_values_that_look_like_flags_are_values():
    # argparse alone read '-inf' as -i with 'nf' and '-1e-3' as a flag: both values here
    from ggml_py.cli.main import build_parser
    parser = build_parser()
    for text, value in [("-inf", -math.inf), ("-Infinity", -math.inf), ("-1e-3", -1e-3),
                        ("-2.5E+1", -25.0), ("-.5", -0.5), ("-3", -3.0)]:
        assert parser.parse_args(["--temp", text]).temp == value
        assert parser.parse_args(["--temp", text, "-p", "x"]).prompt == "x"
        assert parser.parse_args(["--tem", text]).temp == value     # (argparse's abbreviation)
    # -n -1 and a prompt that is a negative number are still what they were
    args = parser.parse_args(["-n", "-1", "-p", "-5"])
    assert args.n_predict == -1 and args.prompt == "-5"


def test_main_bad_files():
    truncated = scratch_path("cli-truncated.gguf")
    data = open(model_path("f32"), "rb").read()
    with open(truncated, "wb") as f:
        f.write(data[:len(data) // 3])
    for path, fragment in [(scratch_path("none.gguf"), "no such file"),
                           (TEXT_FILE, "not a GGUF file"), (truncated, "truncated")]:
        line = assert_one_line_error(main("-m", path, "-n", 1), code=1)
        assert path in line and fragment in line
    # the file, then the problem, as for -m (it was Python's "[Errno 2] No such file ...")
    for path, problem in [(scratch_path("none.txt"), "No such file"),
                          (os.path.dirname(TEXT_FILE), "Is a directory")]:
        line = assert_one_line_error(main("-m", model_path("f32"), "-f", path), 1)
        assert line.startswith(f"ggml-main: error: {path}: cannot read ({problem}"), line
        proc = run("ggml_py.cli.perplexity", "-m", model_path("f32"), "-f", path)
        line = assert_one_line_error(proc, 1)
        assert line.startswith(f"ggml-perplexity: error: {path}: cannot read ({problem}"), line


def verbose_prompt_tokens(*args):
    """The `id -> 'piece'` lines of `ggml-main --verbose-prompt -n 0` (the bundled model)."""
    proc = main(*args, "--verbose-prompt", "-n", 0, "-t", 1)
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stderr.splitlines() if re.match(r" *\d+ -> '", line)]


def test_main_prompt_is_read_as_llama_cli_reads_it(tmp_path):
    plain = verbose_prompt_tokens("-p", "ROMEO.")
    assert plain[0] == "     1 -> '<s>'" and len(plain) == 5
    # special tokens are parsed, as common_tokenize(ctx, prompt, true, true)
    assert verbose_prompt_tokens("-p", "<s>ROMEO.") == plain[:1] + plain
    # -f drops one trailing newline (common/arg.cpp)
    (tmp_path / "one.txt").write_bytes(b"ROMEO.\n")
    assert verbose_prompt_tokens("-f", tmp_path / "one.txt") == plain
    (tmp_path / "two.txt").write_bytes(b"ROMEO.\n\n")
    assert len(verbose_prompt_tokens("-f", tmp_path / "two.txt")) == len(plain) + 1
    # an invalid UTF-8 byte becomes its byte token, from -p (argv) and -f alike
    (tmp_path / "byte.txt").write_bytes(b"ROMEO.\xff\n")
    from_file = verbose_prompt_tokens("-f", tmp_path / "byte.txt")
    assert from_file == verbose_prompt_tokens("-p", os.fsdecode(b"ROMEO.\xff"))
    assert from_file[:-1] == plain and from_file[-1].startswith("   258 -> ")   # <0xFF>


def test_a_prompt_starting_with_a_dash_is_the_prompt():
    # as llama-cli: the word after -p is the prompt, even "-ROMEO" (argparse took it for a flag)
    dashed = verbose_prompt_tokens("-p", "-ROMEO.")
    assert dashed == verbose_prompt_tokens("--prompt=-ROMEO.")
    assert dashed[:1] == ["     1 -> '<s>'"] and "-" in dashed[1]
    assert verbose_prompt_tokens("-p", "--x") == verbose_prompt_tokens("--prompt=--x")


def test_presence_and_frequency_penalties():
    line = next(l for l in main("-p", "ROMEO.", "-n", 0, "--presence-penalty", 0.5,
                                "--frequency-penalty", 0.25).stderr.splitlines()
                if l.startswith("sampler params"))
    assert "frequency_penalty = 0.250, presence_penalty = 0.500" in line
    # a huge presence penalty: greedy text never repeats a token of the window
    llm = gg.Llama(n_ctx=256)
    ids = list(llm.generate_tokens("ROMEO.", gg.SamplingParams(temperature=0, presence_penalty=1e4,
                                                               repeat_last_n=-1), max_tokens=40))
    prompt = llm.tokenize("ROMEO.")
    assert len(ids) == 40 and len(set(ids)) == 40 and not set(ids) & set(prompt)
    plain = list(llm.generate_tokens("ROMEO.", gg.SamplingParams(temperature=0), max_tokens=40))
    assert len(set(plain)) < 40                              # without it, tokens repeat
    assert "".join(llm.generate("ROMEO.", max_tokens=40, temperature=0, presence_penalty=1e4,
                                repeat_last_n=-1)) == llm.detokenize(ids)


def test_vocabularies_llama_cpp_refuses_or_cannot_start_from():
    from llama_models import V, edited_model
    no_bos = edited_model("cli-no-bos.gguf", keys={"tokenizer.ggml.add_bos_token": ([V.BOOL], False)})

    def error_after_loading(proc):
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        return proc.stderr.strip().splitlines()[-1]

    assert "error: the prompt is empty" in error_after_loading(main("-m", no_bos, "-p", "", "-n", 2, "-c", 64))
    assert main("-m", no_bos, "-p", "The", "-n", 2, "-c", 64).returncode == 0
    add_eos = edited_model("cli-add-eos.gguf", keys={"tokenizer.ggml.add_eos_token": ([V.BOOL], True)})
    for module, args in (("ggml_py.cli.main", ["-p", "Hello", "-n", 2]),
                         ("ggml_py.cli.perplexity", ["-f", TEXT_FILE, "-c", 16])):
        line = error_after_loading(run(module, "-m", add_eos, "-c", 64, *args))
        assert "error: this vocabulary adds an EOS token after every text" in line
    with pytest.raises(ValueError, match="adds an EOS token after every text"):
        gg.Llama(add_eos, n_ctx=64).perplexity("hello " * 200, n_ctx=16)


def test_process_escapes_as_llama_cpp():
    # common.cpp's string_process_escapes: \n \r \t \' \" \\ and \xHH; others stay
    assert process_escapes(r"A\nB\r\t\'\"\\") == "A\nB\r\t'\"\\"
    assert process_escapes(r"\\n \q \x4 \xZZ \x41\x7a \\") == "\\n \\q \\x4 \\xZZ Az \\"
    assert process_escapes("ends with \\") == "ends with \\"
    # \xHH is a byte: UTF-8 with its neighbours, else kept as a byte (surrogate escape)
    assert process_escapes(r"\xc3\xa9 \xff") == "\u00e9 \udcff"
    assert process_escapes("a\udcff\\tb") == "a\udcff\tb"


def test_main_processes_escapes_unless_no_escape(tmp_path):
    newline = verbose_prompt_tokens("-p", "ROMEO.\nJULIET.")
    assert verbose_prompt_tokens("-p", r"ROMEO.\nJULIET.") == newline
    (tmp_path / "esc.txt").write_bytes(rb"ROMEO.\x0aJULIET." + b"\n")
    assert verbose_prompt_tokens("-f", tmp_path / "esc.txt") == newline
    kept = verbose_prompt_tokens("-p", r"ROMEO.\nJULIET.", "--no-escape")
    assert len(kept) == len(newline) + 1 and "'\\'" in "".join(kept)


def test_threads_zero_or_less_is_the_default():
    # as llama.cpp: -t 0 / -t -1 (its default) mean the default thread count
    for n in (0, -1):
        proc = main("-m", model_path("f32"), "-t", n, "-n", 0)
        assert proc.returncode == 0, proc.stderr
        assert f"system_info: n_threads = {gg.default_threads()} / " in proc.stderr


def test_read_prompt_file_keeps_bytes_and_drops_one_newline(tmp_path):
    (tmp_path / "p.txt").write_bytes(b"a\xffb\n\n")
    assert read_prompt_file(tmp_path / "p.txt") == "a\udcffb\n"


def test_main_prompt_longer_than_the_context_echoes_nothing(tmp_path):
    (tmp_path / "long.txt").write_text("ROMEO. " * 300)
    proc = main("-f", tmp_path / "long.txt", "-n", 1, "-t", 1)
    assert proc.returncode == 1 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("ggml-main: error: the prompt has")


def test_a_vocabulary_warning_is_a_warning_line_of_the_program():
    from llama_models import V, edited_model
    bad = edited_model("cli-bad-bos.gguf", keys={"tokenizer.ggml.bos_token_id": ([V.UINT32], 5000)})
    proc = main("-m", bad, "-p", "ROMEO.", "-n", 2, "-t", 1)
    assert proc.returncode == 0, proc.stderr
    assert "main: warning: " in proc.stderr and "bos_token_id = 5000 is past" in proc.stderr
    assert "warnings.warn" not in proc.stderr and "TokenizerWarning" not in proc.stderr


def test_closed_standard_streams_are_no_input_and_logs_nowhere():
    # `2>&-`: the logs must not fall into stdout (print's file=None); `<&-`: no input
    def shell(redirect):
        cmd = f"{shlex.quote(sys.executable)} -m ggml_py.cli.main -t 1 -p ROMEO. -n 4 -s 1 {redirect}"
        return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=ENV,
                              cwd=CWD, timeout=120)
    closed, whole = shell("2>&-"), main("-t", 1, "-p", "ROMEO.", "-n", 4, "-s", 1)
    assert closed.returncode == 0 and closed.stdout == whole.stdout
    assert "perf:" in whole.stderr and "perf:" not in closed.stdout
    chat = shell("-cnv <&-")
    assert chat.returncode == 0 and "main: EOF by user" in chat.stderr, chat.stderr


def test_main_stops_when_the_context_is_full():
    # as llama-cli -n -2: prompt and generated tokens together fill the context, then a line says so
    n_prompt = len(gg.Llama(model_path("f32"), n_ctx=16, n_threads=1).tokenize("Hello"))
    args = ("-m", model_path("f32"), "-c", 16, "-p", "Hello", "--ignore-eos", "-s", 1, "-t", 1)
    full = main(*args, "-n", -2)
    assert full.returncode == 0 and "main: context full, stopping" in full.stderr, full.stderr
    # the same tokens where -n ends it exactly there: no context-full line
    exact = main(*args, "-n", 16 - n_prompt)
    assert exact.returncode == 0 and exact.stdout == full.stdout, exact.stderr
    assert "context full" not in exact.stderr
    fewer = main(*args, "-n", 15 - n_prompt)
    assert fewer.stdout != full.stdout and full.stdout.startswith(fewer.stdout.rstrip("\n"))

def test_context_sizes():
    # -c 0: the model's training context; a larger one is warned about, as llama.cpp does
    proc = main("-m", model_path("f32"), "-c", 0, "-p", "Hi", "-n", 1, "-t", 1)
    assert proc.returncode == 0, proc.stderr
    assert "n_ctx = 512," in proc.stderr and "training context overflow" not in proc.stderr
    proc = main("-m", model_path("f32"), "-c", 1024, "-p", "Hi", "-n", 1, "-t", 1)
    assert proc.returncode == 0, proc.stderr
    assert "main: warning: n_ctx (1024) > n_ctx_train (512) -- possible training context " \
           "overflow" in proc.stderr
    assert "Warning" not in proc.stderr       # one line of the program's own, not Python's
    proc = run("ggml_py.cli.perplexity", "-m", model_path("f32"), "-f", TEXT_FILE, "-c", 0,
               "--chunks", 1, "-t", 1)
    assert proc.returncode == 0, proc.stderr
    assert "n_ctx=512," in proc.stderr and proc.stdout.startswith("[1]")



def test_open_llama_logs_the_context_warning_and_shows_the_others(monkeypatch):
    import warnings
    from ggml_py.cli import common
    real = common.Llama

    def noisy(*args, **kwargs):
        warnings.warn("something else", DeprecationWarning)
        return real(*args, **kwargs)
    monkeypatch.setattr(common, "Llama", noisy)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        _, logged = common.open_llama(model_path("f32"), n_ctx=1024, n_threads=1)
    assert logged == ["n_ctx (1024) > n_ctx_train (512) -- possible training context overflow"]
    assert [(w.category, str(w.message)) for w in shown] == [(DeprecationWarning, "something else")]

def test_a_model_without_a_training_context_needs_c(tmp_path):
    path = tmp_path / "ctx0.gguf"
    write_random_llama(path, RandomLlamaSpec(n_vocab=N_VOCAB, n_ctx_train=0), vocab=vocab())
    for module in ("ggml_py.cli.main", "ggml_py.cli.perplexity"):
        line = assert_one_line_error(run(module, "-m", path, "-f", TEXT_FILE), code=1)
        assert "context_length is 0" in line and "argument -c" not in line


def test_a_context_too_large_to_allocate_is_one_line():
    huge = 10**12
    for module, args in (("ggml_py.cli.main", ["-c", huge, "-p", "x"]),
                         ("ggml_py.cli.perplexity", ["-c", huge]),
                         ("ggml_py.cli.bench", ["model", "-p", huge, "-n", 1, "-t", 1, "-r", 1])):
        line = assert_one_line_error(run(module, *args), code=1)
        assert f"cannot allocate the KV cache for n_ctx={huge}: " in line and "GiB" in line


def run_into_closed_pipe(module, *args):
    """(exit status, stderr) of a run whose stdout is a pipe nobody reads any more
    (`ggml-main ... | head -c 20` once head has its 20 bytes)."""
    proc = subprocess.Popen([sys.executable, "-m", module, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV, cwd=CWD)
    proc.stdout.close()
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, err.decode()


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    tune_file = tmp_path / "t.json"
    bench([(64, 64, gg.F32)], m_values=[1, 2], thread_counts=[1]).save(tune_file)
    for module, args in (("ggml_py.cli.main", ["-m", model_path("f32"), "-p", "Once", "-n", 8]),
                         ("ggml_py.cli.tune", ["analyze", tune_file])):
        status, err = run_into_closed_pipe(module, *args)
        assert status == 141, err   # as if killed by SIGPIPE
        assert "Traceback" not in err and "error" not in err, err


@pytest.mark.parametrize("started_ignoring", [False, True])
def test_main_ctrl_c_stops_and_prints_timings(started_ignoring):
    # started_ignoring: SIGINT ignored at the start, as for a background job of a script
    # (Python keeps it ignored; llama.cpp's programs, and these, stop on it all the same)
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if started_ignoring else None
    proc = subprocess.Popen([sys.executable, "-m", "ggml_py.cli.main", "-m", model_path("f32"),
                             "-p", "Once", "-n", "-1", "-c", "8192", "--ignore-eos", "-s", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=CWD,
                            preexec_fn=ignore)
    try:
        os.set_blocking(proc.stdout.fileno(), False)
        received, deadline = b"", time.monotonic() + 60
        while len(received) < 40 and time.monotonic() < deadline:   # the prompt and some text
            received += proc.stdout.read() or b""
            time.sleep(0.05)
        assert proc.poll() is None, "finished before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    err = err.decode()
    assert proc.returncode == 130
    assert "Traceback" not in err and "interrupted" in err
    assert re.search(r"       eval time = .* tokens per second", err)


def test_run_takes_sigint_only_where_it_was_ignored_and_puts_it_back():
    from ggml_py.cli.common import run

    def custom(signum, frame):
        pass
    previous = signal.getsignal(signal.SIGINT)
    try:
        for handler, inside in ((signal.SIG_IGN, signal.default_int_handler), (custom, custom),
                                (signal.default_int_handler, signal.default_int_handler)):
            signal.signal(signal.SIGINT, handler)
            seen = []
            assert run("prog", lambda argv: seen.append(signal.getsignal(signal.SIGINT)) or 0) == 0
            assert seen == [inside] and signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_outside_the_compute_loops_is_one_line_too(capsys, monkeypatch):
    # while loading or tokenizing (the programs' own handlers cover generation and scoring)
    from ggml_py.cli import main as main_cli, perplexity as ppl_cli
    from ggml_py.tokenizer.tokenizer import Tokenizer

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(Tokenizer, "tokenize", interrupted)
    for module, prog, args in ((main_cli, "ggml-main", ["-p", "ROMEO.", "-n", "4"]),
                               (ppl_cli, "ggml-perplexity", ["-f", TEXT_FILE, "-c", "16"])):
        assert module.cli(["-m", model_path("f32"), *args]) == 130
        _, err = capsys.readouterr()
        assert err.endswith(f"{prog}: interrupted\n") and "Traceback" not in err

    # and while perplexity scores its chunks (its own handler) under its own name
    monkeypatch.undo()
    monkeypatch.setattr(gg.Llama, "_timed_decode", interrupted)
    assert ppl_cli.cli(["-m", model_path("f32"), "-f", TEXT_FILE, "-c", "16"]) == 130
    _, err = capsys.readouterr()
    assert err.endswith("ggml-perplexity: interrupted\n") and "Traceback" not in err


def test_perplexity_cli_matches_api():
    proc = run("ggml_py.cli.perplexity", "-m", model_path("f32"), "-f", TEXT_FILE, "-c", 128,
               "-b", 64, "--chunks", 3, "-ctk", "f32")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert re.fullmatch(r"\[1\]\d+\.\d{4},\[2\]\d+\.\d{4},\[3\]\d+\.\d{4},", out[0]), out[0]
    m = re.fullmatch(r"Final estimate: PPL = (\d+\.\d{4}) \+/- (\d+\.\d{5})", out[1])
    assert m, out[1]
    assert "seconds per pass - ETA" in proc.stderr
    llm = gg.Llama(model_path("f32"), n_ctx=128, kv_type="f32")
    result = llm.perplexity(open(TEXT_FILE, encoding="utf-8").read(), n_ctx=128, n_chunks=3)
    assert float(m.group(1)) == pytest.approx(result.ppl, rel=1e-5)
    assert float(m.group(2)) == pytest.approx(result.error, rel=1e-3)


def test_perplexity_processes_escapes_in_the_file(tmp_path):
    # llama.cpp escapes params.prompt, which holds the -f text
    (tmp_path / "real.txt").write_text("ROMEO. Ay me!\n" * 24)
    (tmp_path / "esc.txt").write_text(r"ROMEO. Ay me!\n" * 24)
    args = ("-m", model_path("f32"), "-c", 16, "--chunks", 2, "-t", 1)
    real = run("ggml_py.cli.perplexity", *args, "-f", tmp_path / "real.txt")
    assert real.returncode == 0, real.stderr
    assert run("ggml_py.cli.perplexity", *args, "-f", tmp_path / "esc.txt").stdout == real.stdout
    kept = run("ggml_py.cli.perplexity", *args, "-f", tmp_path / "esc.txt", "--no-escape")
    assert kept.returncode == 0 and kept.stdout != real.stdout


def test_perplexity_cli_errors():
    for args, fragment in [(["--chunks", 0], "--chunks: must be at least 1, or negative for all chunks"),
                           (["-c", 2], "-c/--ctx-size: must be at least 4"),
                           (["-c", -5], "-c/--ctx-size: must be at least 0"),
                           (["-f", ""], "-f/--file: expected a file name")]:
        line = assert_one_line_error(run("ggml_py.cli.perplexity", *args), code=2)
        assert fragment in line
    short = run("ggml_py.cli.perplexity", "-m", model_path("f32"), "-f", TEXT_FILE, "-c", 4096)
    assert short.returncode == 1 and "Traceback" not in short.stderr
    assert short.stderr.strip().splitlines()[-1].startswith(
        "ggml-perplexity: error: you need at least 8192 tokens")
    assert_one_line_error(run("ggml_py.cli.perplexity", "-m", model_path("f32"), "-c", "x"), code=2)
    line = assert_one_line_error(run("ggml_py.cli.perplexity", "-m", TEXT_FILE, "-f", TEXT_FILE),
                                 code=1)
    assert "not a GGUF file" in line


def test_bench_model_table_and_json():
    proc = run("ggml_py.cli.bench", "model", "-m", model_path("f32"), "-p", 16, "-n", 4, "-t", "1,2",
               "-r", 2)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| llama")]
    assert len(rows) == 4
    assert re.match(r"\| llama \S+ F32 +\| +\d+\.\d\d MiB \|", rows[0])
    assert [r.split("|")[5].strip() for r in rows] == ["1", "1", "2", "2"]
    assert [r.split("|")[6].strip() for r in rows] == ["pp16", "tg4", "pp16", "tg4"]
    assert all(re.search(r"\d+\.\d\d ± \d+\.\d\d \|$", r) for r in rows)
    # the roofline of each tgN row: the read bandwidth measured on its own thread count
    roofline = re.findall(r"tg4 at (\d) threads: \d+ % of the roofline \((\d+\.\d) GB/s", proc.stdout)
    assert [t for t, _ in roofline] == ["1", "2"], proc.stdout
    proc = run("ggml_py.cli.bench", "model", "-m", model_path("f32"), "-p", 8, "-n", 2, "-t", 1,
               "-r", 1, "--json")
    out = json.loads(proc.stdout)
    results = out["results"]
    assert [r["test"] for r in results] == ["pp8", "tg2"] and results[0]["avg_ts"] > 0
    assert list(out["read_bandwidth"]) == ["1"] and results[1]["read_bandwidth"] == out["read_bandwidth"]["1"]
    assert results[1]["roofline_ts"] == results[1]["read_bandwidth"] / out["weight_bytes_per_token"]
    # -p 0 leaves the prompt test out (as llama-bench), the generation test still runs
    proc = run("ggml_py.cli.bench", "model", "-m", model_path("f32"), "-p", 0, "-n", 2, "-t", 1,
               "-r", 1, "--json")
    assert [r["test"] for r in json.loads(proc.stdout)["results"]] == ["tg2"]
    # past the training context (512) without a word, as llama-bench
    proc = run("ggml_py.cli.bench", "model", "-m", model_path("f32"), "-p", 600, "-n", 0, "-t", 1,
               "-r", 1)
    assert proc.returncode == 0 and "pp600" in proc.stdout and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("text, low, high, expected", [
    ("1,2,4", 1, None, [1, 2, 4]), ("0", 0, None, [0]), ("-3,7", None, None, [-3, 7]),
    ("3", None, 3, [3]), ("4", None, 3, "at most 3"), ("0", 1, None, "at least 1"),
    ("5", 1, 4, "in 1..4"), ("", None, None, "comma-separated"), ("1,", None, None, "comma-separated"),
    ("1,,2", None, None, "comma-separated"), ("x", None, None, "comma-separated"), ("1.5", None, None, "comma"),
])
def test_int_list_values_and_refusals(text, low, high, expected):
    if isinstance(expected, list):
        assert int_list(text, low, high) == expected
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=expected):
            int_list(text, low, high)


def test_thread_list_is_bounded_by_the_pool_limit():
    assert thread_list(f"1,{gg.MAX_THREADS}") == [1, gg.MAX_THREADS]
    for text in ("0", str(gg.MAX_THREADS + 1)):
        with pytest.raises(argparse.ArgumentTypeError, match="thread counts"):
            thread_list(text)


def test_bench_names_a_flag_before_the_subcommand_and_a_shape_too_large():
    line = assert_one_line_error(run("ggml_py.cli.bench", "--unknown"), 2)
    assert "unrecognized argument --unknown: the subcommand comes first" in line
    line = assert_one_line_error(run("ggml_py.cli.bench", "mulmat", "--shapes", "99999999999x99999999999"), 1)
    assert "--shapes 99999999999x99999999999: needs" in line and "GiB of memory" in line


def test_bench_model_busy_runs_every_test_quiet_and_busy_and_stops_its_spinners():
    import psutil
    proc = run("ggml_py.cli.bench", "model", "-m", model_path("f32"), "-p", 0, "-n", 2, "-t", 1,
               "-r", 1, "--busy", 1, "--json")
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["results"]
    assert [(r["test"], r["busy"]) for r in results] == [("tg2", 0), ("tg2", 1)]
    assert all(r["avg_ts"] > 0 for r in results)
    spinners = [p for p in psutil.process_iter(["cmdline"])
                if any("os.getppid() == parent" in a for a in (p.info["cmdline"] or []))]
    assert spinners == []
    for bad in ("-1", "65", "x"):
        line = assert_one_line_error(run("ggml_py.cli.bench", "model", "--busy", bad), 2)
        assert "argument --busy" in line


def test_bench_model_errors():
    line = assert_one_line_error(run("ggml_py.cli.bench", "model", "-m", scratch_path("none.gguf")), 1)
    assert "no such file" in line
    assert_one_line_error(run("ggml_py.cli.bench", "model", "-m", model_path("f32"), "--bad"), 2)
    assert_one_line_error(run("ggml_py.cli.bench", "model", "-m", model_path("f32"), "-t", "x"), 2)
    for flag, value in (("-t", "999"), ("-t", ","), ("-t", ""), ("-t", "1,"), ("-p", "-1"),
                        ("-n", "4,x"), ("-r", "0"), ("-b", "0")):
        line = assert_one_line_error(run("ggml_py.cli.bench", "model", "-p", 4, "-n", 1, "-r", 1,
                                         flag, value), 2)
        assert f"argument {flag}" in line
    if os.path.exists("/dev/full"):   # stdout that cannot be written
        with open("/dev/full", "w") as full:
            proc = subprocess.run([sys.executable, "-m", "ggml_py.cli.bench", "model", "-p", "4",
                                   "-n", "1", "-t", "1", "-r", "1"], stdout=full,
                                  stderr=subprocess.PIPE, text=True, env=ENV, cwd=CWD, timeout=120)
        assert "No space left on device" in assert_one_line_error(proc, 1)


# ---- --tune / --tune-file -----------------------------------------------------------

def test_tune_bench_save_then_schedule_with_the_file(tmp_path):
    tune_file = tmp_path / "tiny.tune.json"
    proc = main("-m", model_path("q4_0"), "-t", 2, "-b", 8, "--tune", "--tune-file", tune_file)
    assert proc.returncode == 0, proc.stderr
    assert "tune: saved" in proc.stderr and proc.stdout == ""       # bench, save, exit
    data = json.loads(tune_file.read_text())
    assert data["format"] == "ggml_py-mulmat-tune" and data["thread_counts"] == [2]
    assert data["m_values"] == [1, 2, 4, 8]

    args = ("-m", model_path("q4_0"), "-p", "Once upon a time", "-n", 8, "-t", 2, "--temp", 0,
            "-c", 64)
    tuned, plain = main(*args, "--tune-file", tune_file), main(*args)
    assert tuned.returncode == 0 and plain.returncode == 0, tuned.stderr + plain.stderr
    assert f"tune: scheduling MUL_MAT profiles with {tune_file}" in tuned.stderr
    assert tuned.stdout == plain.stdout      # profiles change speed, not the greedy text
    # the file's Ms end at 8, the batches of this run (-c 64, default -b) at 64: said once
    assert tuned.stderr.count(f"tune: {tune_file} was benched up to M=8; batches of up to 64 "
                              f"tokens are estimated past it (ggml-tune --m-max 6 benches them)") == 1
    within = main(*args, "-b", 8, "--tune-file", tune_file)
    assert within.returncode == 0 and "estimated past it" not in within.stderr

    # a tune file for other shapes, or a corrupt one, is refused and the run falls back
    other = main("-m", model_path("q8_0"), "-p", "Hi", "-n", 2, "-t", 2, "--tune-file", tune_file)
    assert other.returncode == 0 and "has no times for" in other.stderr
    assert "using the fallback rule" in other.stderr
    (tmp_path / "bad.json").write_text('{"format": "ggml_py-mulmat-tune", "vers')
    bad = main("-m", model_path("q4_0"), "-p", "Hi", "-n", 2, "--tune-file", tmp_path / "bad.json")
    assert bad.returncode == 0 and "truncated" in bad.stderr and "Traceback" not in bad.stderr


def test_the_tune_file_hint_stays_within_what_ggml_tune_benches():
    from types import SimpleNamespace
    from ggml_py.cli.common import setup_tune
    lines = []
    for batch, ctx, hint in ((100, 4096, "ggml-tune --m-max 7 benches them"),
                             (8192, 8192, "ggml-tune benches up to --m-max 12, M=4096")):
        llm = SimpleNamespace(set_tune=lambda path: None, n_ctx=lambda: ctx, n_threads=lambda: 2,
                              model=SimpleNamespace(tune=SimpleNamespace(m_values=[1, 2, 4],
                                                                         thread_counts=[1, 2])))
        args = SimpleNamespace(tune=False, tune_file="t.json", batch_size=batch)
        setup_tune(llm, args, lines.append)
        assert lines[-1] == (f"tune: t.json was benched up to M=4; batches of up to {min(batch, ctx)} "
                             f"tokens are estimated past it ({hint})")
    # a thread count between two benched ones: its times are estimated, and it says so
    llm.model.tune.thread_counts = [1, 4]
    setup_tune(llm, args, lines.append)
    assert "tune: t.json was benched at 1, 4 threads; times at 2 are estimated between them" in lines


def test_tune_at_start_up_benches_nothing_for_a_refused_prompt_or_text():
    # the prompt's and the text's checks come first: a run that cannot go ahead is refused at once
    long_prompt = main("-m", model_path("q4_0"), "-c", 8, "-p", "ROMEO. " * 20, "-t", 1, "--tune")
    short_text = run("ggml_py.cli.perplexity", "-m", model_path("q4_0"), "-f", TEXT_FILE,
                     "-c", 4096, "-t", 1, "--tune")
    for proc, error in ((long_prompt, "ggml-main: error: the prompt has"),
                        (short_text, "ggml-perplexity: error: you need at least 8192 tokens")):
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith(error)
        assert "tune: benched" not in proc.stderr


def test_perplexity_with_tune_at_start_up():
    args = ("-m", model_path("q4_0"), "-f", TEXT_FILE, "-c", 32, "-b", 32, "--chunks", 2, "-t", 2)
    tuned = run("ggml_py.cli.perplexity", *args, "--tune")
    plain = run("ggml_py.cli.perplexity", *args)
    assert tuned.returncode == 0, tuned.stderr
    assert "tune: benched" in tuned.stderr
    final = [re.search(r"Final estimate: PPL = ([\d.]+)", p.stdout).group(1) for p in (tuned, plain)]
    # profiles differ only by rounding (Q8 activations vs f32 sgemm): PPL within 1 %
    assert abs(float(final[0]) - float(final[1])) <= 1e-2 * float(final[1])


# ---- the bundled model: the README's first command ------------------------------

def test_main_runs_the_bundled_model_by_default():
    # `ggml-main -p "ROMEO." -n 256`: no -m; non-greedy by default, -s makes it repeatable
    first = main("-p", "ROMEO.", "-n", 12, "-s", 5, "-t", 2)
    again = main("-p", "ROMEO.", "-n", 12, "-s", 5, "-t", 2)
    assert first.returncode == 0, first.stderr
    assert "shakespeare-5m-q8_0.gguf" in first.stderr and "Q8_0" in first.stderr
    assert first.stdout.startswith("ROMEO.") and len(first.stdout) > len("ROMEO.") + 10
    assert first.stdout == again.stdout
    assert "temp = 0.800" in first.stderr and "top_p = 0.950" in first.stderr
    assert re.search(r"eval time = .* / +11 runs", first.stderr)


def test_the_readmes_sample_is_what_the_program_writes():
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    command = '$ ggml-main -p "ROMEO." -n 60 -s 1\n'
    sample = readme[readme.index(command) + len(command):].split("\n```", 1)[0]
    proc = main("-p", "ROMEO.", "-n", 60, "-s", 1)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n") == sample


def test_perplexity_of_the_bundled_model_on_held_out_plays():
    # no -m, no -f: the bundled model on the bundled test text, at its 256-token context
    proc = run("ggml_py.cli.perplexity", "--chunks", 8, "-t", 2)
    assert proc.returncode == 0, proc.stderr
    assert "n_ctx=256" in proc.stderr
    ppl = float(re.search(r"Final estimate: PPL = ([\d.]+)", proc.stdout).group(1))
    assert 20 < ppl < 40      # the full test text measures 32.2 (docs/model.md)


# ---- the scripts of examples/ and benchmarks/ ---------------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script, args, code", [
    ("examples/graph_demo.py", ["-t", "0"], 2),
    ("examples/graph_demo.py", ["--width", "0"], 2),
    ("examples/mulmat_tune.py", ["-m", "x.gguf", "-o", "t.json", "--m-max", "0"], 2),
    ("examples/mulmat_tune.py", ["-m", "x.gguf", "-o", "t.json"], 1),   # no such model
    ("benchmarks/make_model.py", ["x.gguf", "--shape", "foo"], 2),
    ("benchmarks/make_model.py", ["x.gguf", "--type", "Q4_K", "--shape", "64x2"], 2),
    ("benchmarks/make_model.py", ["x.gguf", "--type", "Q4_K", "--shape", "256x1"], 2),   # n_ff 704
    ("benchmarks/make_model.py", ["x.gguf", "--shape", "64x1", "--n-vocab", "999999"], 2),
    ("benchmarks/make_model.py", ["x.gguf", "--shape", "64x1", "--n-vocab", "100"], 2),
    ("benchmarks/tune_vs_oracle.py", ["--type", "q9"], 2),
    ("benchmarks/tune_vs_oracle.py", ["--threads", "0"], 2),
    ("benchmarks/tune_vs_oracle.py", ["--save-oracle", "/nonexistent/o.json"], 1),
    ("benchmarks/tune_vs_oracle.py", ["--tune-file", "t.json", "--save-tune", "s.json"], 2),
    ("benchmarks/tune_vs_oracle.py", ["--tune-file", "t.json", "--passes", "2"], 2),
    ("benchmarks/compare_llama_cpp.py", ["-m", "x.gguf", "--bogus"], 2),   # not "-m is required"
    ("benchmarks/compare_llama_cpp.py", ["-m", "x.gguf", "-t", "0"], 2),
    ("benchmarks/compare_llama_cpp.py", ["-m", "x.gguf", "--chunks", "1"], 2),
    ("benchmarks/compare_llama_cpp.py", ["-m", "/nonexistent.gguf"], 1),
])
def test_scripts_end_bad_arguments_in_one_line(script, args, code, tmp_path):
    path = os.path.join(REPO, script)
    proc = subprocess.run([sys.executable, path, *args], capture_output=True, text=True,
                          env=ENV, cwd=tmp_path, timeout=120)
    assert_one_line_error(proc, code)
    assert not (tmp_path / "x.gguf").exists()


def test_the_mulmat_tune_example_benches_a_model_and_analyzes_its_file(tmp_path):
    from ggml_py.model.bundled import default_model_path
    from ggml_py.files.gguf_reader import GGUFModelFile
    from ggml_py.tune.data import load
    from ggml_py.model.weights import matrix_shapes
    script = os.path.join(REPO, "examples", "mulmat_tune.py")
    model = default_model_path()
    proc = subprocess.run([sys.executable, script, "-m", model, "-o", "t.json", "--m-max", "1",
                           "--n-threads", "1", "-q"], capture_output=True, text=True, env=ENV,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0 and "-> t.json" in proc.stdout, proc.stderr
    data = load(tmp_path / "t.json", model=matrix_shapes(GGUFModelFile(model))[0])
    assert data.thread_counts == [1] and data.m_values == [1, 2]
    proc = subprocess.run([sys.executable, script, "analyze", "t.json"], capture_output=True,
                          text=True, env=ENV, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "n_threads=1" in proc.stdout, proc.stderr


@pytest.mark.parametrize("threads", ["", "0", "abc"])
def test_bench_pool_bad_threads_end_in_one_line(threads):
    assert_one_line_error(run("ggml_py.cli.bench", "pool", "-t", threads, "--nodes", 10), 2)


@pytest.mark.parametrize("args", [
    ["mulmat", "--repeat", "0"], ["mulmat", "--bandwidth-mib", "0"], ["mulmat", "--max-seconds", "nan"],
    ["mulmat", "--profiles", "nope", "--shapes", "32x32", "--m", "1", "--types", "f32",
     "--threads", "1", "--repeat", "1", "--bandwidth-mib", "1"],
    ["pool", "--nodes", "0"], ["pool", "--repeats", "0"], ["pool", "-t", "1,", "--nodes", "5"],
    ["mulmat", "--m", "0"], ["mulmat", "--m", "1,,2"], ["mulmat", "--threads", "300"],
    ["mulmat", "--shapes", "32x"], ["mulmat", "--shapes", "0x32"], ["mulmat", "--types", "q9"],
    ["mulmat", "--types", "i32"],
])
def test_bench_subcommands_bad_values_end_in_one_line(args):
    assert_one_line_error(run("ggml_py.cli.bench", *args), 2)


@pytest.mark.parametrize("args", [[], ["pool", "--spin-us", "nan"], ["pool", "--spin-us", "-5"],
                                  ["pool", "--spin-us", "1e30"]])
def test_bench_without_a_subcommand_or_with_a_bad_spin_ends_in_one_line(args):
    assert_one_line_error(run("ggml_py.cli.bench", *args), 2)


@pytest.mark.parametrize("args, message", [
    (["mulmat", "--profiles", "blas-split", "--shapes", "32x32", "--m", "1", "--types", "f32",
      "--threads", "1", "--repeat", "1", "--bandwidth-mib", "1"],
     "--profiles blas-split: no such profile for F32"),
    (["model", "-p", "0", "-n", "0"], "-p and -n are all 0: no test to run"),
])
def test_bench_with_nothing_to_measure_says_so(args, message):
    assert message in assert_one_line_error(run("ggml_py.cli.bench", *args), 1)


def test_bench_mulmat_json_stays_json_when_a_case_is_skipped():
    proc = run("ggml_py.cli.bench", "mulmat", "--shapes", "32x48,32x64", "--types", "q4_0", "--m", "1",
               "--threads", "1", "--repeat", "1", "--bandwidth-mib", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [r["k"] for r in json.loads(proc.stdout)["results"]] and "skipping" in proc.stderr


def test_tune_vs_oracle_refuses_a_tune_file_of_other_shapes(tmp_path):
    # scored anyway, its every choice was ggml's rule reported as "tuned"
    bench([(64, 64, gg.Type.F32)], m_values=[1, 2], thread_counts=[1]).save(tmp_path / "small.json")
    script = os.path.join(REPO, "benchmarks/tune_vs_oracle.py")
    proc = subprocess.run([sys.executable, script, "--tune-file", str(tmp_path / "small.json"),
                           "--threads", "1"], capture_output=True, text=True, env=ENV, cwd=tmp_path,
                          timeout=120)
    assert "has no times for 5 of the model's matrix shapes" in assert_one_line_error(proc, 1)


def test_flag_values_at_their_edges_keep_their_meaning(capsys):
    from ggml_py.cli import main as main_cli, perplexity as ppl_cli
    from ggml_py.cli.common import thread_count
    assert thread_count("256") == 256                       # MAX_THREADS itself is allowed

    def text(*args):
        assert main_cli.cli(["-m", model_path("f32"), "-p", "Hello", "-t", "1", *args]) == 0
        return capsys.readouterr().out
    sampled = ("-n", "8", "--temp", "1", "-s", "0")         # 0 is a seed, not "random"
    assert text(*sampled) == text(*sampled)
    greedy = ("-n", "24", "--temp", "0", "--repeat-penalty", "1.5")
    plain = text("-n", "24", "--temp", "0")
    assert text(*greedy, "--repeat-last-n", "0") == plain   # 0: no penalty
    assert text(*greedy, "--repeat-last-n", "-1") != plain  # -1: the whole context
    assert text("-n", "1", "-ctv", "f16")                   # the same type as -ctk's default

    # --chunks past the text's end: the log counts the chunks there are
    assert ppl_cli.cli(["-m", model_path("f32"), "-f", TEXT_FILE, "-c", "64", "--chunks", "100",
                        "-t", "1"]) == 0
    out, err = capsys.readouterr()
    said = int(re.search(r"perplexity over (\d+) chunks", err).group(1))
    assert said == len(re.findall(r"\[\d+\]", out)) < 100


# ---- flag edges and defaults of llama.cpp's programs, each pinned by a test of its own --

def test_main_repeat_last_n_of_minus_two_is_refused():
    # as llama.cpp: -1 (the whole context) is the lowest window; -2 is refused when parsed
    line = assert_one_line_error(main("--repeat-last-n", -2, "-p", "ROMEO."), code=2)
    assert "--repeat-last-n: must be at least -1" in line


def test_main_long_prompt_flag_takes_a_dashed_value_too():
    # as llama-cli: the word after --prompt is the prompt, as after -p, even "-ROMEO."
    assert verbose_prompt_tokens("--prompt", "-ROMEO.") == verbose_prompt_tokens("-p", "-ROMEO.")


def test_main_seed_zero_is_a_seed():
    # as llama.cpp: only a negative -s draws a random seed; 0 gives the same text every run
    runs = [main("-p", "ROMEO.", "-n", 8, "-s", 0, "-t", 1) for _ in range(2)]
    assert runs[0].returncode == 0 and "seed = 0\n" in runs[0].stderr, runs[0].stderr
    assert runs[0].stdout == runs[1].stdout


def test_main_runs_on_past_a_full_context_without_n():
    # llama.cpp's default -n is -1: no limit but end of text (ignored here); a full context
    # shifts (half of what follows the kept prompt is dropped) and generation goes on
    proc = subprocess.Popen([sys.executable, "-m", "ggml_py.cli.main", "-p", "ROMEO.", "-c", "32",
                             "--keep", "-1", "--ignore-eos", "-s", "1", "-t", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=CWD)
    try:
        os.set_blocking(proc.stdout.fileno(), False)
        received, deadline = b"", time.monotonic() + 60
        while len(received) < 2000 and time.monotonic() < deadline:   # far past 32 tokens
            received += proc.stdout.read() or b""
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    err = err.decode()
    assert len(received) >= 2000 and proc.returncode == 130, err
    assert "n_predict = -1," in err and "context full" not in err
    shifts = int(re.search(r"context shifts = +(\d+)", err).group(1))
    assert shifts >= 10


def test_main_n_predict_minus_two_runs_until_the_context_is_full_and_below_is_refused():
    # llama.cpp: -2 is "until the context is full"; nothing below -2 has a meaning
    proc = main("-p", "ROMEO.", "-c", 48, "-n", -2, "--ignore-eos", "-s", 1, "-t", 1)
    assert proc.returncode == 0, proc.stderr
    assert "n_predict = -2," in proc.stderr and "main: context full, stopping" in proc.stderr
    # prompt and generated tokens fill the 48 positions; the last one sampled is not evaluated
    assert re.search(r"total time = .* / +47 tokens", proc.stderr)
    line = assert_one_line_error(main("-n", -3, "-p", "ROMEO."), code=2)
    assert "-n/--n-predict: must be at least -2" in line


def test_main_the_later_of_prompt_and_file_is_the_prompt(tmp_path):
    # as llama.cpp (common/arg.cpp sets params.prompt flag by flag, in order)
    (tmp_path / "juliet.txt").write_text("JULIET.\n")
    assert (verbose_prompt_tokens("-p", "ROMEO.", "-f", tmp_path / "juliet.txt")
            == verbose_prompt_tokens("-p", "JULIET."))
    assert (verbose_prompt_tokens(f"--file={tmp_path / 'juliet.txt'}", "--prompt=ROMEO.")
            == verbose_prompt_tokens("-p", "ROMEO."))


def test_perplexity_without_an_error_bar_prints_no_plus_minus(tmp_path):
    # a model whose logits are all 0: every token scores log(n_vocab), the variance is 0 and
    # the error NaN; llama-perplexity then prints the estimate alone and a warning line
    spec = RandomLlamaSpec(n_vocab=N_VOCAB)
    weights = random_weights(spec)
    weights["output_norm.weight"] = np.zeros_like(weights["output_norm.weight"])
    write_random_llama(tmp_path / "uniform.gguf", spec, vocab=vocab(), weights=weights)
    proc = run("ggml_py.cli.perplexity", "-m", tmp_path / "uniform.gguf", "-f", TEXT_FILE,
               "-c", 16, "--chunks", 2, "-t", 1)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == f"Final estimate: PPL = {N_VOCAB}.0000"
    assert "Unexpected negative standard deviation of log(prob)" in proc.stderr


def test_perplexity_reads_control_token_texts_as_text(tmp_path):
    # as llama-perplexity (common_tokenize with parse_special false): "<s>" in the file is
    # three characters of text, not the BOS token
    text = "ROMEO. <s> Ay me! " * 20
    (tmp_path / "s.txt").write_text(text)
    llm = gg.Llama(model_path("f32"), n_ctx=64)
    as_text, as_special = (len(llm.tokenize(text, special=s)) // 16 for s in (False, True))
    assert as_text != as_special
    proc = run("ggml_py.cli.perplexity", "-m", model_path("f32"), "-f", tmp_path / "s.txt",
               "-c", 16, "-t", 1)
    assert proc.returncode == 0, proc.stderr
    assert f"calculating perplexity over {as_text} chunks, n_ctx=16," in proc.stderr


def test_the_python_api_and_the_programs_take_the_same_default_context(tmp_path):
    # no n_ctx / no -c: 2048, or the training context when that is smaller
    for n_ctx_train, expected in ((4096, 2048), (512, 512)):
        path = tmp_path / f"m{n_ctx_train}.gguf"
        write_random_llama(path, RandomLlamaSpec(n_vocab=N_VOCAB, n_ctx_train=n_ctx_train),
                           vocab=vocab())
        with gg.Llama(str(path), n_threads=1) as llm:
            assert llm.n_ctx() == expected
        proc = run("ggml_py.cli.main", "-m", path, "-p", "a", "-n", 1, "-t", 1)
        assert proc.returncode == 0, proc.stderr
        assert f"generate: n_ctx = {expected}," in proc.stderr
