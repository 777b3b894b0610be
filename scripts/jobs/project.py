"""The project's own parser asked, before a tuning job starts, whether it takes each --range key: one run of its
training script (--source-dir's entry point, else the image's example, app/example/train.py) with
`fit --print_config`, the job's static hyperparameters and each range at its low end (its first choice), as a child's
command line gives them. A key no setting has (or a value its type refuses) fails in one line, before the SDK is
imported and before any child fails in the cloud. A script that is not a LightningCLI one, or that does not run here
(a package it imports is missing: SDK 3.x's venv has no torch), is not asked, and a note says so. The run takes what
the script's imports take (8-16 s for the example on 2 CPU cores), once a tune command.

    python scripts/run_sagemaker.py tune ... --range optimizer.lr=1e-4:1e-1:log  # asks app/example/train.py

    from jobs import project  # from scripts/

    project.refusal("usage: ...\\nerror: unrecognized arguments: --optimizer.learning_rate=0.1\\n")
"""

import os
import re
import subprocess
import sys

from jobs.tuning import Tuning

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "app", "example", "train.py")  # the code a job without --source-dir runs: the image's
TIMEOUT_S = 120  # the script's imports and parsing: 16 s for the example on a busy 2-core machine
REFUSED = 2  # argparse's (and jsonargparse's) exit status for arguments it refuses
# the lines of jsonargparse's message that say why, below its first line (which names the group only)
REASON = re.compile(r"not accepted|Got value|[Uu]nrecognized|invalid choice|not a valid")


def entry(tuning: Tuning) -> str:
    job = tuning.job
    return os.path.join(job.source_dir, job.entry_point) if job.source_dir else EXAMPLE


def arguments(tuning: Tuning) -> list[str]:
    """The probe's command line after the script: every static setting and each range's low end, `--key=value` as the
    runtime gives them (SageMaker's own sagemaker_* entries are not settings)."""
    static = [f"--{k}={v}" for k, v in tuning.job.hyperparameters.items() if not k.startswith("sagemaker_")]
    return ["fit", "--print_config", *static, *(f"--{r.key}={r.point(0)}" for r in tuning.ranges)]


def refusal(stderr: str) -> str | None:
    """The parser's refusal in one line (its `error:` line and the line that says why), or None when the output holds
    none."""
    lines = stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("error:")), None)
    if start is None:
        return None
    why = next((line.strip(" -") for line in lines[start + 1 :] if REASON.search(line)), "")
    return " ".join(filter(None, [lines[start][len("error:") :].strip(), why]))


def check(tuning: Tuning) -> None:
    """SystemExit with one line if the project's parser refuses the ranges; a note on stderr if it cannot be asked."""
    script = entry(tuning)
    with open(script, errors="replace") as f:
        if "LightningCLI" not in f.read():  # a plain script might start training on --print_config
            print(f"note: --range keys not checked: {script} is not a LightningCLI script", file=sys.stderr)
            return
    try:
        run = subprocess.run(
            [sys.executable, script, *arguments(tuning)],
            cwd=os.path.dirname(script),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        print(
            f"note: --range keys not checked: {script} took over {TIMEOUT_S} s to print its configuration",
            file=sys.stderr,
        )
        return
    if run.returncode == REFUSED and (why := refusal(run.stderr)):
        keys = ", ".join(r.key for r in tuning.ranges)
        raise SystemExit(
            f"error: {os.path.basename(script)} refuses the job's settings ({keys} and the static ones): {why}"
        )
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"note: --range keys not checked: {script} does not run here ({last[:200]})", file=sys.stderr)
