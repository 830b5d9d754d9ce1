"""ggml-main's conversation and interactive modes, driven as a person drives them: through
a pseudo-terminal (pexpect), on the bundled model. Each test starts one program."""
import io
import os
import pathlib
import re
import sys

import pytest

import ggml_py as gg

pexpect = pytest.importorskip("pexpect")

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(gg.__file__)))
ENV = dict(os.environ, PYTHONPATH=PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           TERM="xterm")
ENV.pop("NO_COLOR", None)


def spawn(tmp_path, *args):
    """ggml-main in a pseudo-terminal, its output (stdout and stderr) read as text and
    kept whole in child.logfile_read."""
    child = pexpect.spawn(sys.executable, ["-m", "ggml_py.cli.main", "-t", "1", *map(str, args)],
                          cwd=str(tmp_path), env=ENV, encoding="utf-8", timeout=60,
                          dimensions=(40, 200))
    child.logfile_read = io.StringIO()
    return child


def finish(child):
    """Everything the program wrote until it ended, and its exit status."""
    child.expect(pexpect.EOF)
    rest = child.before
    child.close()
    return rest, child.exitstatus


def end_of_input(child):
    """Ctrl-D, again if the first one was lost: typed in the moment between the end of a
    reply and the line editor taking the terminal over, the terminal's end-of-file mark
    does not reach it (with -i nothing on the screen says when it has; -cnv's "> " does)."""
    for _ in range(10):
        child.sendeof()
        if child.expect([pexpect.EOF, pexpect.TIMEOUT], timeout=3) == 0:
            rest = child.before
            child.close()
            return rest, child.exitstatus
    raise AssertionError("the program did not end at the end of input")


def runs(text, what):
    """The count on a timings line ('sampling time', 'eval time')."""
    return int(re.search(rf"{what} = .* / +(\d+) (?:runs|tokens)", text).group(1))


def test_a_two_turn_conversation_in_colour_then_end_of_input(tmp_path):
    child = spawn(tmp_path, "-cnv", "-sys", "Thou art Hamlet.", "-n", 8, "-s", 1, "--color")
    # the opening (the system message in the model's template: a plain transcript for
    # the bundled model, which has none) in the prompt's colour, then the input prompt
    child.expect_exact("\x1b[33mSystem: Thou art Hamlet.\n".replace("\n", "\r\n"))
    child.expect_exact("> ")
    replies = []
    for line in ("Who art thou?", "Speak again."):
        child.sendline(line)
        child.expect_exact(line + "\r\n")          # typed, in the user's colour
        child.expect_exact("\r\n> ")
        replies.append(child.before)
    child.sendeof()
    rest, status = finish(child)
    assert status == 0, rest
    assert "main: EOF by user" in rest and "Traceback" not in rest
    assert all(re.search(r"\w", reply) for reply in replies), replies    # streamed replies
    assert "> \x1b[1m\x1b[32mWho art thou?" in child.logfile_read.getvalue()   # typed in green
    assert runs(rest, "sampling time") <= 16                # -n 8 a reply
    assert runs(rest, "prompt eval time") > 0


def test_a_reverse_prompt_hands_over_to_the_user_and_generation_goes_on(tmp_path):
    # -r "\n" (escapes processed, as llama-cli): every reply ends at its first newline
    child = spawn(tmp_path, "-i", "-r", "\\n", "-p", "ROMEO.", "-n", 100, "-s", 1)
    child.expect_exact("ROMEO.")
    child.expect_exact("\r\n")
    first = child.before
    child.sendline("Speak, good Romeo")
    child.expect_exact("Speak, good Romeo\r\n")
    assert child.before == "", "generation went on past the reverse prompt"
    child.expect_exact("\r\n")
    second = child.before
    rest, status = end_of_input(child)
    assert status == 0 and "main: EOF by user" in rest, rest
    assert "\n" not in first + second
    assert runs(rest, "sampling time") < 100     # neither reply ran to its -n budget


def test_ctrl_c_stops_a_reply_and_a_second_ctrl_c_ends_with_the_timings(tmp_path):
    # a reply that would run for thousands of tokens (no end of text, a large context)
    child = spawn(tmp_path, "-cnv", "-n", -1, "-c", 4096, "--ignore-eos", "-s", 1)
    child.expect_exact("> ")
    child.sendline("Who art thou?")
    child.expect_exact("Who art thou?\r\n")
    child.expect(r"\w[\s\S]{40}")                # some of the reply
    child.sendintr()
    child.expect_exact("\r\n> ")                 # back at the input, the reply cut
    child.sendline("Speak again.")
    child.expect_exact("Speak again.\r\n")
    child.expect(r"\w[\s\S]{40}")
    child.sendintr()
    child.expect_exact("\r\n> ")
    child.sendintr()                             # at the input: the end
    rest, status = finish(child)
    assert status == 130, rest
    assert "main: interrupted" in rest and "Traceback" not in rest
    assert 0 < runs(rest, "eval time") < 4000


def main(capsys, monkeypatch, *args, stdin=""):
    """ggml-main run in this process with stdin read from a string: (status, out, err)."""
    from ggml_py.cli.main import cli
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    status = cli(["-t", "1", *map(str, args)])
    out, err = capsys.readouterr()
    return status, out, err


def test_piped_input_is_a_conversation_too(capsys, monkeypatch):
    status, out, err = main(capsys, monkeypatch, "-cnv", "-n", 4, "-s", 1,
                            stdin="Who art thou?\n\nSpeak again.\n")
    assert status == 0, err
    # four inputs read (the last one: the end), the empty line sent nothing
    assert out.count("> ") == 4 and "\n> \n> " in out
    assert "main: EOF by user" in err
    assert "\x1b[" not in out             # no colours where they were not asked for


def test_a_reverse_prompt_alone_ends_the_run_there(capsys, monkeypatch):
    # not interactive: the text stops after the reverse prompt (llama-cli's -r without -i)
    status, out, err = main(capsys, monkeypatch, "-p", "ROMEO.", "-r", "\\n", "-n", 100, "-s", 1,
                            "--no-display-prompt")
    assert status == 0, err
    assert out.endswith("\n") and "\n" not in out[:-1]
    assert not out.startswith("ROMEO.")     # --no-display-prompt


def test_a_prompt_ending_with_the_reverse_prompt_is_the_users_cue_at_once(capsys, monkeypatch):
    # as llama-cli: -i waits for input before any reply, -r alone ends there
    opening = "Bob: Hello.\nUser:"
    status, out, err = main(capsys, monkeypatch, "-i", "-r", "User:", "-p", opening, "-n", 16,
                            "-s", 1, stdin="")
    assert status == 0 and out.rstrip("\n") == opening and "main: EOF by user" in err, err
    status, out, err = main(capsys, monkeypatch, "-r", "User:", "-p", opening, "-n", 16, "-s", 1)
    assert status == 0 and out.rstrip("\n") == opening, err


def test_a_reverse_prompt_alone_keeps_the_plain_paths_full_context_rule(capsys, monkeypatch):
    # -n 60 in a context of 16: the plain path stops at the full context; -r does too
    args = ("-c", 16, "-n", 60, "-s", 1, "-p", "ROMEO.", "--ignore-eos")
    status, plain, err = main(capsys, monkeypatch, *args)
    assert status == 0 and "main: context full, stopping" in err
    status, out, err = main(capsys, monkeypatch, *args, "-r", "QQQQ")
    assert status == 0 and "main: context full, stopping" in err and out == plain


def test_keep_all_of_a_long_opening_still_shifts_half_the_context(capsys, monkeypatch):
    # --keep -1 over an opening longer than half the context: a shift keeps half of it
    status, out, err = main(capsys, monkeypatch, "-cnv", "-c", 32, "--keep", -1, "-n", 12, "-s", 1,
                            "-sys", "You are a player in a play by Shakespeare; speak well.",
                            stdin="Who art thou?\nSpeak again.\nOnce more.\n")
    assert status == 0 and "main: EOF by user" in err, err
    assert int(re.search(r"context shifts = +(\d+)", err).group(1)) >= 1


def test_special_tokens_are_printed_with_sp(capsys, monkeypatch):
    _, plain, _ = main(capsys, monkeypatch, "-p", "ROMEO.", "-n", 2, "-s", 1)
    _, special, _ = main(capsys, monkeypatch, "-p", "ROMEO.", "-n", 2, "-s", 1, "-sp")
    assert special == "<s>" + plain       # the BOS, as its text


@pytest.mark.parametrize("args, message", [
    (["-sys", "Be brief."], "-sys/--system-prompt goes with -cnv/--conversation"),
    (["--keep", "-2"], "--keep: must be at least -1"),
    (["-r", ""], "-r/--reverse-prompt: expected a text"),
])
def test_bad_conversation_flags_end_in_one_line(capsys, args, message):
    from ggml_py.cli.main import cli
    with pytest.raises(SystemExit) as stop:      # refused when parsed: no model is loaded
        cli(["-p", "ROMEO.", *args])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("ggml-main: error:")
    assert message in err and err.count("\n") == 1


def test_the_models_own_chat_template_is_used(capsys, monkeypatch):
    from llama_models import V, edited_model
    template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
                "'<|im_end|>\\n' }}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    model = edited_model("chat-template.gguf", keys={"tokenizer.chat_template": ([V.STRING], template)})
    status, out, err = main(capsys, monkeypatch, "-m", model, "-c", 128, "-cnv", "-sys",
                            "Be brief.", "-p", "Hail", "-n", 3, "-s", 1)
    assert status == 0, err
    assert "no chat template" not in err
    # the opening echoed as the template writes it (these markers are text in this
    # vocabulary; each text piece starts with SentencePiece's prefix space, as llama.cpp's)
    opening = out.split("<|im_start|>assistant\n")[0]
    assert opening.replace("\u2581", "").replace(" <", "<") == \
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHail<|im_end|>\n"


def test_the_readmes_conversation_is_what_the_program_shows(tmp_path):
    readme = pathlib.Path(__file__).resolve().parents[1].joinpath("README.md").read_text("utf-8")
    start = readme.index("$ ggml-main -cnv ")
    command, _, shown = readme[start + 2:].split("\n```", 1)[0].partition("\n")
    typed = [line[2:] for line in shown.splitlines() if line.startswith("> ") and line[2:]]
    # the README's command, stderr dropped by the shell as it says, in a pseudo-terminal
    program = command.replace("ggml-main", f"{sys.executable} -m ggml_py.cli.main -t 1", 1)
    child = pexpect.spawn("/bin/sh", ["-c", program], cwd=str(tmp_path), env=ENV,
                          encoding="utf-8", timeout=60, dimensions=(40, 200))
    child.logfile_read = io.StringIO()
    for line in typed:
        child.expect_exact("> ")
        child.sendline(line)
    child.expect_exact("\r\n> ")
    child.sendeof()
    finish(child)
    assert child.logfile_read.getvalue().replace("\r\n", "\n") == shown + "\n"
