"""Every program that writes a file follows output_file's rules: a new name or a regular
file (replaced whole), links written through, never a device, FIFO, socket or an input;
and a run killed mid-write leaves nothing behind (or, on a file system without unnamed
temporaries, a file the next run removes)."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import ggml_py as gg
from ggml_py.files import output as output_file
from ggml_py.model.bundled import default_model_path
from ggml_py.files.output import OutputPathError, atomic_output, check_output_path

# the ggml_py under test, run from a neutral folder (a checkout's ggml_py/ must not shadow it)
ENV = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(gg.__file__))))


def special_files(folder):
    """{name: what the refusal says} for a character device, a FIFO, a socket and links
    to them, made in `folder`; a kind the system does not let us make is left out."""
    made = {}
    try:
        os.mknod(folder / "dev", 0o600 | 0o020000, os.makedev(1, 3))   # like /dev/null
        made["dev"] = "is a character device"
    except (PermissionError, OSError):
        pass
    os.mkfifo(folder / "fifo")
    made["fifo"] = "is a FIFO"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(folder / "sock"))
    made["sock"] = "is a socket"
    for name, why in list(made.items()):
        os.symlink(name, folder / f"link-to-{name}")
        made[f"link-to-{name}"] = why
    os.symlink("nowhere", folder / "dangling")
    made["dangling"] = "a symbolic link that leads to no file"
    return made


PROGRAM_RUNNER = ("import sys, importlib; module, name = sys.argv.pop(1).split(':'); "
                  "sys.exit(getattr(importlib.import_module(module), name)(sys.argv[1:]))")
PROGRAMS = {
    "ggml-quantize": ("ggml_py.cli.quantize:main",
                      lambda out: [default_model_path(), out, "Q4_0", "--allow-requantize", "-q"]),
    "ggml-convert": ("ggml_py.cli.convert:main", lambda out: [".", "--outfile", out]),
    "ggml-tune -o": ("ggml_py.cli.tune:main", lambda out: ["--model-shape", "1.1B", "-o", out, "-q"]),
    "ggml-tune --plot": ("ggml_py.cli.tune:main",
                         lambda out: ["analyze", "missing.json", "--plot", out + ".png"]),
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_programs_refuse_devices_fifos_sockets_and_dangling_links(tmp_path, program):
    entry, arguments = PROGRAMS[program]
    refused = special_files(tmp_path)
    if "dev" not in refused:
        print("character device not made here (mknod needs root): tested FIFOs, sockets and links")
    before = {name: os.lstat(tmp_path / name) for name in os.listdir(tmp_path)}
    for name, why in refused.items():
        if program == "ggml-tune --plot":    # the picture's name gets ".png": link that name
            os.rename(tmp_path / name, tmp_path / f"{name}.png")
        proc = subprocess.run([sys.executable, "-c", PROGRAM_RUNNER, entry, *arguments(name)],
                              capture_output=True, text=True, timeout=120, env=ENV, cwd=tmp_path)
        if program == "ggml-tune --plot":
            os.rename(tmp_path / f"{name}.png", tmp_path / name)
        assert proc.returncode == 1, (name, proc.stderr)
        assert why in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    after = {name: os.lstat(tmp_path / name) for name in os.listdir(tmp_path)}
    assert {n: (s.st_ino, s.st_mode) for n, s in after.items()} == \
        {n: (s.st_ino, s.st_mode) for n, s in before.items()}


def test_a_link_to_a_regular_file_is_written_through(tmp_path):
    target = tmp_path / "real" / "out.bin"
    target.parent.mkdir()
    target.write_bytes(b"old")
    os.symlink(target, tmp_path / "link.bin")
    assert check_output_path(tmp_path / "link.bin") == str(target)
    with atomic_output(tmp_path / "link.bin") as tmp:
        with open(tmp, "wb") as f:
            f.write(b"new")
    assert os.path.islink(tmp_path / "link.bin") and target.read_bytes() == b"new"
    assert sorted(os.listdir(target.parent)) == ["out.bin"]


@pytest.mark.parametrize("path, why", [("", "needs a name"), ("missing/x", "no such folder"),
                                       (".", "is a directory"), ("x/", "is a directory")])
def test_paths_no_file_can_be_written_at(tmp_path, monkeypatch, path, why):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputPathError, match=why):
        check_output_path(path)


def test_an_input_is_never_replaced_through_another_name(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    os.symlink(model, tmp_path / "link.gguf")
    os.link(model, tmp_path / "hard.gguf")
    for out in (model, tmp_path / "link.gguf", tmp_path / "hard.gguf", tmp_path / "." / "m.gguf"):
        with pytest.raises(OutputPathError, match="is the model; write the output to another path"):
            check_output_path(out, {model: "the model"})
    assert model.read_bytes() == b"GGUF"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in any folder")
def test_a_folder_without_write_permission(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    with pytest.raises(OutputPathError, match="cannot write in"):
        check_output_path(folder / "x")


def kill_mid_write(out, input_model, unnamed):
    """Start ggml-quantize writing `out`, SIGKILL it once it holds a file open in out's
    folder (the output being written), and wait for it."""
    script = (f"import sys; import ggml_py.files.output as o; o.USE_UNNAMED_TEMPORARIES = {unnamed}\n"
              "from ggml_py.cli.quantize import main\n"
              "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", script, str(input_model), str(out), "Q4_0",
                             "--allow-requantize", "-q"], env=ENV, stderr=subprocess.PIPE,
                            cwd=out.parent.parent)
    folder = str(out.parent)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                targets = [os.readlink(f"/proc/{proc.pid}/fd/{fd}")
                           for fd in os.listdir(f"/proc/{proc.pid}/fd")]
            except OSError:     # an fd closed while it was listed
                continue
            if any(t.startswith(folder + "/") for t in targets):
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.001)
    finally:
        proc.wait(timeout=60)
    return proc.returncode


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to see the write start")
@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed-temporary", "named-temporary"])
def test_a_run_killed_mid_write_leaves_nothing_that_stays(tmp_path, unnamed):
    if unnamed and not output_file.USE_UNNAMED_TEMPORARIES:
        pytest.skip("this system has no O_TMPFILE")
    src = tmp_path / "in" / "model.gguf"
    src.parent.mkdir()
    src.write_bytes(open(default_model_path(), "rb").read())
    out = tmp_path / "out" / "model-q4_0.gguf"
    out.parent.mkdir()
    assert kill_mid_write(out, src, unnamed) == -signal.SIGKILL
    left = os.listdir(out.parent)
    if unnamed:
        assert left == []          # the file had no name yet
    else:                          # a hidden temporary with the dead run's pid ...
        assert len(left) == 1 and left[0].startswith(".model-q4_0.gguf.ggml-py-"), left
    # ... which the next run removes; a temporary of a live process is kept
    alive = out.parent / f".model-q4_0.gguf.ggml-py-{os.getpid()}.0123abcd.tmp"
    alive.write_bytes(b"in use")
    proc = subprocess.run([sys.executable, "-c", PROGRAM_RUNNER, "ggml_py.cli.quantize:main",
                           str(src), str(out), "Q4_0", "--allow-requantize", "-q"],
                          capture_output=True, text=True, timeout=120, env=ENV, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out.parent)) == sorted([alive.name, out.name])


def test_a_failed_block_leaves_the_old_file_whole(tmp_path):
    out = tmp_path / "out.bin"
    out.write_bytes(b"old")
    for unnamed in (True, False):
        output_file.USE_UNNAMED_TEMPORARIES, saved = unnamed, output_file.USE_UNNAMED_TEMPORARIES
        try:
            with pytest.raises(RuntimeError), atomic_output(out) as tmp:
                with open(tmp, "wb") as f:
                    f.write(b"half")
                raise RuntimeError("stopped")
        finally:
            output_file.USE_UNNAMED_TEMPORARIES = saved
        assert out.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.bin"]
