"""PID 1's log copier (command_output.copy), on the pipes of real child processes: output passes as it comes, newline or
not; the tail kept for the failure line stays small whatever the lines; a copier that cannot write still drains the
pipe, so the command never blocks on it, and says so in one line.

    .venv/bin/python -m pytest tests/unit/boot/test_command_output.py -q
"""

import collections
import io
import subprocess
import sys
import time

import pytest

from sagemaker_lightning.boot import command_output

pytestmark = pytest.mark.unit

HANG_S = 60  # a wait that ends a test which would otherwise hang (a blocked child): many times what it needs


class Target:
    """sys.stdout as the copier uses it: bytes to .buffer, then flush()."""

    def __init__(self):
        self.buffer = io.BytesIO()

    def flush(self):
        pass


class Broken:
    """sys.stdout whose writes fail, as they do once the log's pipe is closed."""

    name = "<stdout>"

    def __init__(self):
        self.buffer = self

    def write(self, data):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


def child(code: str) -> subprocess.Popen:
    """A Python process running `code`, its standard output a pipe; its standard input too, which `code` may wait on."""
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def test_output_without_a_newline_passes_at_once():
    """A progress bar's \\r line, then the process works on (here: until the test lets it end): the text is in the log
    while it does, not when it ends."""
    proc = child("import sys; sys.stdout.write('\\r 50% done'); sys.stdout.flush(); sys.stdin.read()")
    target = Target()
    try:
        command_output.copy(proc.stdout, target, collections.deque())
        deadline = time.monotonic() + HANG_S
        while b"50% done" not in target.buffer.getvalue():
            assert time.monotonic() < deadline, "the text did not pass while the process ran"
            time.sleep(0.05)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_the_tail_keeps_the_last_lines_each_cut_short():
    """A 10 MB line (a tensor printed whole), then a short one: the log gets every byte; the tail, kept for the
    failure line, the long line's start only, and the last line."""
    size = 10_000_000
    proc = child(f"import sys; sys.stdout.write('RuntimeError: ' + 'R' * {size} + '\\nthe end')")
    tail = collections.deque(maxlen=command_output.LOG_TAIL_LINES)
    target = Target()
    command_output.copy(proc.stdout, target, tail).join(timeout=HANG_S)
    assert proc.wait(timeout=HANG_S) == 0
    assert len(target.buffer.getvalue()) == len("RuntimeError: \nthe end") + size
    first, last = tail
    assert sum(map(len, tail)) < size / 10  # not the 10 MB line whole
    assert first.startswith(b"RuntimeError: RRR") and first.endswith(b"\n")
    assert len(first) <= command_output.LOG_LINE_BYTES + 1
    assert last == b"the end"  # without a newline: the process ended first


def test_a_copier_that_cannot_write_still_drains_the_pipe(capfd):
    """The log's stream fails: the command still ends (it writes 10 MB in lines, far more than a pipe holds, and would
    block on a full pipe forever), and one line says why its output stopped."""
    proc = child("for _ in range(10_000): print('x' * 1000)")
    tail = collections.deque(maxlen=command_output.LOG_TAIL_LINES)
    try:
        thread = command_output.copy(proc.stdout, Broken(), tail)
        assert proc.wait(timeout=HANG_S) == 0, "the process blocked on its full pipe"
    finally:
        proc.kill()
        proc.wait()
    thread.join(timeout=HANG_S)
    assert not thread.is_alive()
    err = capfd.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("entrypoint:")]
    assert len(said) == 1 and "BrokenPipeError" in said[0] and "<stdout>" in said[0], err
    assert "Traceback" not in err
