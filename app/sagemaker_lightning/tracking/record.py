"""Which run a job continues: the run's record (RECORD) that a job keeps where its restart finds it (the checkpoint
directory, synced to S3; model_dir), and the rules that pick the run from it, from a checkpoint's state or from
MLFLOW_RUN_ID. The record, and a checkpoint's state, only propose a run: whoever can write the checkpoint location can
write them. A proposed run is continued only when the run itself agrees (`refusal`, on what the server holds): it is
in this job's experiment, and its tag JOB names this job (`identity`). No torch.

    python -c "from sagemaker_lightning.tracking.record import read_record; print(read_record('ckpts'))"
"""

import json
import os
import posixpath

from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.location import LOCAL

RECORD = "mlflow-run.json"  # the run a restarted job continues: in checkpoint.dirpath, and in model_dir
JOB = "sagemaker_lightning.job"  # the run's tag naming the job that made it (identity); set once, when it is made


def identity(job: str | None, dirpath: str | None) -> str | None:
    """What names this job to its run, the same at each of its restarts: SageMaker's job name (TRAINING_JOB_NAME);
    elsewhere, where no platform names a job across its restarts, the checkpoint directory they resume from, resolved
    (a local path's symbolic links and `..`; a URL's path normalised), so that a copy elsewhere is another job. None:
    neither (no record is kept then)."""
    if job:
        return job
    if not dirpath:
        return None
    from fsspec.core import split_protocol

    protocol, where = split_protocol(dirpath)
    if protocol in LOCAL:
        return os.path.realpath(where)
    return f"{protocol}://{posixpath.normpath('/' + where).lstrip('/')}"


def read_record(dirpath: str | None) -> dict:
    """RECORD in `dirpath` (a directory or an fsspec URL), {} when there is none or it does not read."""
    if not dirpath:
        return {}
    import fsspec

    try:
        with fsspec.open(f"{dirpath.rstrip('/')}/{RECORD}", "r") as f:
            record = json.load(f)
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}


def write_record(dirpath: str, record: dict) -> None:
    """RECORD in `dirpath` (a directory or an fsspec URL), whole or not at all."""
    from sagemaker_lightning.checkpoints import atomic

    atomic.write(f"{dirpath.rstrip('/')}/{RECORD}", json.dumps(record, indent=1).encode())


def continued(env, record: dict, state: dict, job: str | None) -> tuple[str | None, bool]:
    """(the run to continue, whether MLFLOW_RUN_ID named it): MLFLOW_RUN_ID; else the one the checkpoint directory's
    RECORD, or else the checkpoint, proposes for this same job (`job`: its identity), which the run must then agree to
    (`refusal`); a job that resumes another job's checkpoints starts a run of its own, said in a line."""
    if env.get("MLFLOW_RUN_ID"):
        return env["MLFLOW_RUN_ID"], True
    for found in (record, state):
        if found.get("run_id"):
            if job is not None and found.get("job") == job:
                return found["run_id"], False
            say(
                f"mlflow: the checkpoints are job {found.get('job')}'s (run {found['run_id']}), not this job's "
                f"({job}): this job starts a run of its own; MLFLOW_RUN_ID={found['run_id']} continues that one instead"
            )
            return None, False
    return None, False


def refusal(run_experiment: str, tags: dict, experiment: str | None, job: str | None) -> str | None:
    """Why a run the record proposes is not this job's to continue, or None: it must be in this job's experiment (its
    id: `experiment`, None where that experiment does not exist yet) and its tag JOB must name this job (`job`)."""
    if run_experiment != experiment:
        return f"it is in another experiment (id {run_experiment})"
    if job is None or tags.get(JOB) != job:
        return f"its tag {JOB} names {tags.get(JOB) or 'no job'}, not this job ({job})"
    return None
