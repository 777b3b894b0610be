"""How a job fails: one line naming the problem and the fix, on stderr and in SageMaker's failure file.

SageMaker shows the first 1024 characters of `/opt/ml/output/failure` as the job's FailureReason. The
training toolkit writes that file only when it does not exist yet, so the line written here stays.

    SM_OUTPUT_DIR=/tmp python -c "import failure; failure.report('data.batch_size must be positive')"
"""

import os
import sys


class UserError(Exception):
    """A problem the user can fix: bad input, bad environment, missing data. Reported without a traceback."""


def report(message: str, env=os.environ) -> int:
    """Print `message` as one line on stderr and keep it as the job's failure reason; return the exit code."""
    line = " ".join(str(message).split())
    sys.stderr.write(f"ERROR: {line}\n")  # one write: several ranks may fail at once into one stream
    sys.stderr.flush()
    output_dir = env.get("SM_OUTPUT_DIR")
    if output_dir:
        try:  # "x": the first process to fail names the cause; ranks failing after it are consequences
            with open(os.path.join(output_dir, "failure"), "x") as f:
                f.write(line + "\n")
        except OSError:
            pass
    return 1
