"""Which run a job continues: the run's record (RECORD) that a job keeps where its restart finds it (the checkpoint
directory, synced to S3; model_dir), and the rule that picks the run to continue from it, from a checkpoint's state
or from MLFLOW_RUN_ID. No torch.

    python -c "from sagemaker_lightning.tracking.record import read_record; print(read_record('ckpts'))"
"""

import json

from sagemaker_lightning.lines import say

RECORD = "mlflow-run.json"  # the run a restarted job continues: in checkpoint.dirpath, and in model_dir


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


def continued(env, record: dict, state: dict, job: str | None) -> str | None:
    """The run to continue: MLFLOW_RUN_ID; else the one the checkpoint directory's RECORD, or else the checkpoint,
    names for this same job (a job that resumes another job's checkpoints starts a run of its own, said in a line)."""
    if env.get("MLFLOW_RUN_ID"):
        return env["MLFLOW_RUN_ID"]
    for found in (record, state):
        if found.get("run_id"):
            if found.get("job") == job:
                return found["run_id"]
            say(
                f"mlflow: the checkpoints are job {found.get('job')}'s (run {found['run_id']}): this job starts a run "
                f"of its own; MLFLOW_RUN_ID={found['run_id']} continues that one instead"
            )
            return None
    return None
