"""What the training toolkit or a launcher under it (torchrun, mpirun) left when the training program failed, as one
line (failure.py's other table): PID 1 (entrypoint.py) reads the toolkit's failure file and the end of the command's
output, and replaces the file with the line. No torch.

    python -c "from sagemaker_lightning.boot import toolkit_failure as t; print(t.toolkit('ExitCode 137', 'algo-1', '/opt/ml/code'))"
"""

import os
import re
from collections.abc import Callable

from sagemaker_lightning.failure import KILLED, process_ended

# (pattern, its line from the match, the host and the code directory (None: not this row), where to look: "failure"
# the toolkit's failure text, "log" the end of the job's log too (the launchers' summaries are only there: the
# toolkit's failure text under torchrun is `ExitCode 1 ErrorMessage "" Command "torchrun ..."`, seen with
# sagemaker-training 5.1.4 and torch 2.14.1)); first match wins
TOOLKIT: list[tuple[str, Callable[[re.Match, str, str], str | None], str]] = [
    # the program is not in the job's source directory: python "can't open file", the toolkit's Command line
    (
        r"can't open file '[^']*?([^/']+)'|Command \"\S+ -- (\S+?)\"",
        lambda m, host, code: (
            None
            if os.path.exists(os.path.join(code, m[1] or m[2]))
            else f"the entry point {m[1] or m[2]!r} is not in the job's source directory; set entry_point (SDK 2.x) or entry_script (SDK 3.x) to a file of source_dir"
        ),
        "failure",
    ),
    # torchrun's summary, one block per failed process: "rank : 1 (local_rank: 1)" then "exitcode : -9 (pid: 25966)
    # (SIGKILL)"; the first block need not be the cause (the others are ended with SIGTERM)
    (
        r"rank\s*:\s*(\d+) \(local_rank: (\d+)\)\s*\n\s*exitcode\s*:\s*-9\b",
        lambda m, host, code: process_ended(host, int(m[1]), int(m[2]), -9),
        "log",
    ),
    # mpirun: "mpirun noticed that process rank 1 with PID 123 on node algo-2 exited on signal 9 (Killed)."
    (
        r"process rank (\d+) with PID \d+ on node (\S+) exited on signal 9",
        lambda m, host, code: f"training process rank {m[1]} on host {m[2]} {KILLED}",
        "log",
    ),
    # the Process runner: the program itself was killed (exit code 137 or -9)
    (
        r"ExitCode\s*(?:137|-9)\b|exit code[: ]+(?:137|-9)\b",
        lambda m, host, code: f"the training process on host {host} {KILLED}",
        "failure",
    ),
    (
        r"InstallRequirementsError|pip install -r requirements\.txt",
        lambda m, host, code: (
            f"installing the job's requirements.txt failed on host {host}: {_pip_reason(m.string)}; fix requirements.txt in the source directory (the log shows pip's output)"
        ),
        "failure",
    ),
    # an exception the program did not turn into a line of its own: its last line
    (
        r"(?m)^(\w+(?:Error|Exception)): (.+)$",
        lambda m, host, code: f"the training program on host {host} failed: {_last_exception(m.string)}",
        "failure",
    ),
]


def _last_exception(text: str) -> str:
    return re.findall(r"(?m)^(\w+(?:Error|Exception): .+)$", text)[-1]


def _pip_reason(text: str) -> str:
    """pip's own error line, e.g. "No matching distribution found for x==9"."""
    found = re.findall(r"ERROR: (.+)", text)
    return found[-1].strip() if found else "pip failed"


def toolkit(text: str, host: str, code_dir: str, log: str = "") -> str | None:
    """The one line for what the toolkit (or a launcher under it) wrote when the training program failed; None for
    text that is already one line of ours. `code_dir`: where the job's code is (/opt/ml/code); `log`: the end of the
    job's output."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if len(lines) == 1 and not re.search(r"ExecuteUserScriptError|InstallRequirementsError|Framework Error", text):
        return None
    for pattern, line, where in TOOLKIT:
        for match in re.finditer(pattern, text if where == "failure" else f"{text}\n{log}"):
            if (found := line(match, host, code_dir)) is not None:
                return found
    return (
        f"the training program on host {host} failed ({lines[-1] if lines else 'no reason given'}); its log shows why"
    )
