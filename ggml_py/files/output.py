"""How every program of this package writes a file: whole or not at all, never over
something that is not a file.

The rules, checked before any work is done (`check_output_path`):
- the output is a new name, or an existing regular file, which is replaced whole;
- a symbolic link is written through: the file it leads to is replaced and the link
  kept; a link that leads nowhere, a directory, a device, a FIFO or a socket is refused;
- an output that is one of the run's inputs is refused (inputs are memory-mapped while
  they are read);
- the folder must exist and take new files.

The data goes to a temporary file in the destination's folder, which becomes the
destination by a rename once complete (`atomic_output`). Where the file system allows
it the temporary file has no name until then (O_TMPFILE), so a run killed outright
(SIGKILL, power loss) leaves nothing behind; elsewhere it is a hidden
`.NAME.ggml-py-PID.XXXXXXXX.tmp`, which the next write to the same NAME removes once
process PID is gone.
"""
import contextlib
import errno
import os
import re
import secrets
import signal
import stat
import threading

TEMPORARY_TAG = "ggml-py"   # in a named temporary's name: the files the cleanup may remove

# False forces named temporaries (a file system without O_TMPFILE; tests of the fallback)
USE_UNNAMED_TEMPORARIES = hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")


class OutputPathError(ValueError):
    """A path no output may be written at: message is '<path>: <why>'."""


def check_output_path(path, inputs=None):
    """The path of the regular file an output named `path` replaces or creates (a
    symbolic link followed), checked by the rules above; OutputPathError if it may
    not be written. inputs: {path: what it is, for a message} of the files the run reads."""
    path = os.fspath(path)
    if not path:
        raise OutputPathError("the output file needs a name (an empty path was given)")
    if path.endswith((os.sep, os.altsep or os.sep)) or os.path.isdir(path):
        raise OutputPathError(f"{path}: is a directory")
    if os.path.islink(path) and not os.path.exists(path):
        raise OutputPathError(f"{path}: a symbolic link that leads to no file (its target is "
                              f"missing, or the links form a loop)")
    target = os.path.realpath(path)
    if os.path.exists(target):
        mode = os.stat(target).st_mode
        if not stat.S_ISREG(mode):
            raise OutputPathError(f"{path}: is {_kind(mode)}, not a regular file; only a regular "
                                  f"file or a new name is written")
        for source, what in (inputs or {}).items():
            if os.path.exists(source) and os.path.samefile(target, source):
                raise OutputPathError(f"{path}: is {what}; write the output to another path")
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise OutputPathError(f"{path}: no such folder {folder}")
    _probe_folder(path, folder)
    return target


def _kind(mode):
    """What a file of st_mode `mode` is, for a message."""
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def _probe_folder(path, folder):
    """OutputPathError unless a file can be made in `folder`, found by making one (a
    permission test alone does not know read-only file systems or root's rights)."""
    try:
        if USE_UNNAMED_TEMPORARIES:
            with contextlib.suppress(IsADirectoryError, OSError):   # unsupported: named probe
                os.close(os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o600))
                return
        probe = os.path.join(folder, f".{TEMPORARY_TAG}-probe.{secrets.token_hex(4)}")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise OutputPathError(f"{path}: cannot write in {folder} ({exc.strerror})") from None


@contextlib.contextmanager
def atomic_output(path, inputs=None):
    """Yield a path to write the output to; when the block completes, what was written
    there becomes the file `path` names (check_output_path: checked first), in one
    rename. When the block raises, or SIGTERM comes (the process then exits with
    status 143), nothing is left and an old file at `path` is untouched.

    The output gets the permissions a plain `open(path, "w")` gives a new file (0666
    less the umask). The yielded path may have no file-name extension: a writer that
    picks a format by extension must be told the format.
    """
    target = check_output_path(path, inputs)
    folder, base = os.path.split(target)
    remove_stale_temporaries(folder, base)
    with _temporary(folder, base) as (tmp, publish), _termination_raises():
        yield tmp
        publish()


@contextlib.contextmanager
def _temporary(folder, base):
    """(a path to write to, publish()): publish() renames what was written to
    folder/base; leaving the block without it removes the temporary file."""
    if USE_UNNAMED_TEMPORARIES:
        try:
            fd = os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o666)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
        else:
            with _unnamed(fd, folder, base) as pair:
                yield pair
            return
    with _named(folder, base) as pair:
        yield pair


@contextlib.contextmanager
def _unnamed(fd, folder, base):
    """An O_TMPFILE file (fd): written through /proc/self/fd, given a name by linkat
    only when complete, then renamed over the destination."""
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)

    def publish():
        name = _temporary_name(base)
        # linkat(AT_SYMLINK_FOLLOW): a plain link() would link /proc's symlink itself
        os.link(f"/proc/self/fd/{fd}", name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd,
                follow_symlinks=True)
        try:
            os.replace(name, base, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
            raise
    try:
        yield f"/proc/self/fd/{fd}", publish
    finally:
        os.close(fd)
        os.close(dir_fd)


@contextlib.contextmanager
def _named(folder, base):
    """A hidden named temporary file beside the destination, renamed over it when complete."""
    while True:
        tmp = os.path.join(folder, _temporary_name(base))
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    published = False

    def publish():
        nonlocal published
        os.replace(tmp, os.path.join(folder, base))
        published = True
    try:
        yield tmp, publish
    finally:
        if not published:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _temporary_name(base):
    return f".{base}.{TEMPORARY_TAG}-{os.getpid()}.{secrets.token_hex(4)}.tmp"


def remove_stale_temporaries(folder, base):
    """Remove the named temporaries for `base` in `folder` that a killed process left
    (their process no longer runs); returns how many were removed."""
    pattern = re.compile(rf"\.{re.escape(base)}\.{TEMPORARY_TAG}-(\d+)\.[0-9a-f]{{8}}\.tmp")
    removed = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            match = pattern.fullmatch(name)
            if match and not _process_runs(int(match.group(1))):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))
                    removed += 1
    return removed


def _process_runs(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:    # another user's process
        pass
    return True


@contextlib.contextmanager
def _termination_raises():
    """Within the block, SIGTERM (`kill`, `timeout`, a service manager stopping the job)
    raises SystemExit(143) rather than killing the process at once, so that the block's
    cleanup runs; only in the main thread, and only where SIGTERM has its default action
    (a program's own handler is left alone). The default is put back after."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is terminate:   # not one set within the block
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
