"""dist_timeout, the wait for joining and for every collective: checked where it is given, at PID 1 from the job's
hyperparameters (before any parser) and in the plan from the trainer's resolved settings. No torch.

    python -c "from sagemaker_lightning.launch.timeout import dist_timeout; print(dist_timeout({'dist_timeout': '\"60\"'}))"
"""

from collections.abc import Mapping

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch.hyperparameters import typed
from sagemaker_lightning.launch.platforms.cluster import DEFAULT_TIMEOUT_S

MAX_TIMEOUT_S = 28 * 24 * 3600  # the longest a SageMaker job runs (MaxRuntimeInSeconds): no wait needs to be longer


def dist_timeout(given: Mapping) -> int:
    """dist_timeout from the job's hyperparameters (PID 1's, before any parser), whichever form the SDK sent it in (3,
    "3", '"3"': SDK 2.x with source_dir JSON-encodes a string), checked as check_timeout checks the trainer's."""
    value = typed(given.get("dist_timeout", DEFAULT_TIMEOUT_S))
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UserError(f"dist_timeout={value!r} is not a positive whole number of seconds; e.g. 600")
    return check_timeout(value)


def check_timeout(seconds: int) -> int:
    """dist_timeout, when it is a wait torch can hold (timedelta overflows past 999,999,999 days) and a job can use."""
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise UserError(
            f"dist_timeout={seconds} must be a positive number of seconds, at most {MAX_TIMEOUT_S} (28 days, the "
            "longest a SageMaker job runs), e.g. 600"
        )
    return seconds
