"""Start a training job on the image with the SageMaker Python SDK: local mode (docker compose) or the cloud.

SDK 2.x runs it as an Estimator (in .venv), SDK 3.x as a ModelTrainer (in .venv-sdk3); --sdk defaults to the
installed one. Hyperparameters follow the options as key=value words; they reach the training script as `--key value`.
This file wires the parts, one concern a module, in scripts/jobs/ (its __init__.py lists them).

    python scripts/run_sagemaker.py --image sagemaker-lightning:latest --instance-type local --instance-count 2 \
        --input data/synthetic --output runs trainer.max_epochs=1 trainer.accelerator=cpu
    python scripts/run_sagemaker.py --image 123456789012.dkr.ecr.us-east-1.amazonaws.com/sagemaker-lightning:latest \
        --instance-type ml.g5.xlarge --instance-count 2 --role arn:aws:iam::123456789012:role/SageMakerRole \
        --input s3://bucket/cifar10 --output s3://bucket/jobs --spot --tensorboard s3://bucket/tensorboard --dry-run
    python scripts/run_sagemaker.py tune --image <ECR URI> --instance-type ml.g5.xlarge --role <role ARN> \
        --input s3://bucket/cifar10 --output s3://bucket/jobs --objective validation:accuracy --maximize \
        --range optimizer.lr=1e-3:1e-1:log --range data.batch_size=64,128,256 --max-jobs 20 --max-parallel-jobs 4 \
        trainer.max_epochs=10                     # --instance-type local: 2 of its children in local mode
    python scripts/run_sagemaker.py best <tuning job>   # its best child and that child's model.tar.gz
"""

import contextlib
import logging
import os
import sys

from jobs import best, children, options, outcome, project, sdk2, sdk3, spec, tuning
from jobs.watch import ValidationWatch
from sagemaker_lightning.cli import quiet

HERE = os.path.dirname(os.path.abspath(__file__))  # scripts/, where sagemaker_config.yaml is
# Local mode needs no AWS account: a region, a dummy role (spec.LOCAL_ROLE), and no telemetry calls (they fail offline)
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("SAGEMAKER_USER_CONFIG_OVERRIDE", os.path.join(HERE, "sagemaker_config.yaml"))
logging.getLogger("sagemaker.config").setLevel(logging.WARNING)  # its INFO lines go to stdout, --dry-run's JSON too
# SDK 2.x's tuner reads the Estimator's model_data for its tags, which warns that no job has run yet: of course not
logging.getLogger("sagemaker.estimator").addFilter(lambda record: "No finished training job" not in record.getMessage())
quiet.install(sdk=True)  # the SDK's own deprecation notices (SDK 2.x: that 3.x exists; --sdk runs either)


def main(argv: list[str] | None = None) -> int:
    """The command: options → the checked job (spec.make_job, before any SDK import) → SDK 2.x or 3.x starts it, its
    log passing through ValidationWatch → the model's path, or one line saying why the job failed. `tune`: a tuning
    job around it (tune()); `best`: a tuning job's best child (best.py)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["best"]:
        return best.main(argv[1:])
    args = options.parse_args(argv)
    job = spec.make_job(args)
    if args.tune:
        return tune(tuning.make_tuning(args, job))
    if job.channel_input_mode != job.input_mode:
        print(f"note: {spec.LOCAL_FASTFILE}", file=sys.stderr)
    if job.local and "checkpoints" in job.inputs:
        os.makedirs(job.inputs["checkpoints"][len("file://") :], exist_ok=True)
    watch = ValidationWatch(sys.stdout)
    try:
        with contextlib.redirect_stdout(watch):
            model = outcome.run(job).model
    except (RuntimeError, ValueError) as e:  # the SDKs' "job failed" (local mode; UnexpectedStatusException): one line
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error: job {job.name} failed ({reason[:300]}); the job's ERROR line above says why", file=sys.stderr)
        return 1
    if model:
        print(f"model.tar.gz: {model[len('file://') :] if model.startswith('file://') else model}")
    elif not job.dry_run:
        print(f"started {job.name}; model.tar.gz will be under {job.output}")
    if watch.accuracy:  # the last line: what the job's model reached
        print(watch.summary())
    return 0


def tune(t: tuning.Tuning) -> int:
    """The tuning job: its ranges asked of the project's parser (project.py), then created by SDK 2.x or 3.x (in local
    mode, its first children run instead: children.py); waited for unless --no-wait, and its best child named."""
    project.check(t)
    if t.job.local:
        return children.run(t)
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        (sdk2.tune if t.job.sdk == "v2" else sdk3.tune)(t)
        if t.job.wait:
            print(best.report(best.find(boto3.client("sagemaker"), t.name)))
    except (ClientError, BotoCoreError, RuntimeError, ValueError) as e:  # botocore's validation: several lines
        print(f"error: tuning job {t.name}: {' '.join(str(e).split())[:300] or type(e).__name__}", file=sys.stderr)
        return 1
    if not t.job.wait and not t.job.dry_run:
        print(f"started tuning job {t.name}; `run_sagemaker.py best {t.name}` names its best child")
    return 0


if __name__ == "__main__":
    sys.exit(main())
