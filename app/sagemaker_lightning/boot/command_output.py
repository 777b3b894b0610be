"""The command's output, as PID 1 passes it through in a job: as it comes (a \\r progress bar too: no wait for a
newline), its last lines kept, each cut short, for the failure line (toolkit_failure.py). No torch.

    .venv/bin/pytest tests/unit/boot/test_command_output.py
"""

import collections
import os
import threading

LOG_TAIL_LINES = 300  # of the command's output, kept for the failure line: launchers print their summaries there
LOG_LINE_BYTES = 4096  # of each line in that tail, from its start: a line of any length (a tensor printed) is cut
LOG_CHUNK_BYTES = 65536  # read from the command's pipes at a time, and passed on at once, newline or not


def note(line: str) -> None:
    """One line of PID 1's own on stderr, in one write: safe in a signal handler, and where sys.stderr is broken."""
    try:
        os.write(2, f"entrypoint: {' '.join(line.split())}\n".encode())
    except OSError:
        pass


def kept(tail: collections.deque, partial: bytes, chunk: bytes) -> bytes:
    """Adds the lines that `chunk` completes to `tail`, each cut to LOG_LINE_BYTES; returns the line still open."""
    *ended, partial = (partial + chunk).split(b"\n")
    tail.extend(line[:LOG_LINE_BYTES] + b"\n" for line in ended)
    return partial[:LOG_LINE_BYTES]


def copy(stream, to, tail: collections.deque) -> threading.Thread:
    """A thread that copies `stream` to `to` as it comes (a \\r progress bar too: no wait for a newline), keeping its
    last lines in `tail`. Should that fail, it says so in one line and drains `stream` from then on: a command whose
    output pipe is full blocks, a hang with no line."""

    def run() -> None:
        fd, partial, failed = stream.fileno(), b"", False
        while chunk := os.read(fd, LOG_CHUNK_BYTES):
            if failed:
                continue
            try:
                to.buffer.write(chunk)
                to.flush()
                partial = kept(tail, partial, chunk)
            except Exception as e:  # whatever it is: the command must not block on its pipe
                failed = True
                note(
                    f"the command's output is no longer copied to {getattr(to, 'name', to)} ({type(e).__name__}: "
                    f"{e}); it is read and dropped from here on, so that the command does not block"
                )
        if partial:
            tail.append(partial)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
