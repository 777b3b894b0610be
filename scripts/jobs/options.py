"""Start a training job on the image with the SageMaker Python SDK: local mode (docker compose) or the cloud.

That line is what `python scripts/run_sagemaker.py --help` prints above the options this module parses: the command
line, as argparse reads it (types and choices only: spec.make_job checks the job the options describe, and
tuning.make_tuning the tuning job of `tune`, whose options follow the training job's).

    python scripts/run_sagemaker.py --help       # every option with its default
    python scripts/run_sagemaker.py tune --help  # and the tuning job's

    from jobs import options  # from scripts/

    options.parse_args(["--image", "i", "--input", "data", "--output", "runs", "trainer.max_epochs=1"])
"""

import argparse

from jobs.spec import DISTRIBUTIONS, INPUT_MODES
from jobs.tuning import STRATEGIES

TUNE = "tune"  # the first word that makes the command a tuning job: `run_sagemaker.py tune --objective ... --range ...`
COMMANDS = """other commands:
  tune ...             a tuning job whose children train as the options above say (tune --help: its own options)
  best TUNING_JOB      a tuning job's best child: its objective, hyperparameters and model.tar.gz"""


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default, and the other commands' lines as they are written."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options of a training job, or with `tune` first, of a tuning job (args.tune says which)."""
    tune = argv[:1] == [TUNE]
    p = argparse.ArgumentParser(
        prog=f"run_sagemaker.py{' tune' if tune else ''}",
        description=__doc__.split("\n")[0],
        formatter_class=Formatter,
        epilog=None if tune else COMMANDS,
    )
    p.add_argument("--image", required=True, help="image URI: a local tag for local mode, an ECR URI for the cloud")
    p.add_argument("--instance-type", default="local", help="local, local_gpu, or an ml.* type")
    p.add_argument("--instance-count", type=int, default=1, help="hosts (containers in local mode)")
    p.add_argument("--input", required=True, help="training data: a directory, file://... or s3://...")
    p.add_argument("--channel", default="training", help="input channel name (the trainer reads DATA_CHANNEL)")
    p.add_argument(
        "--input-mode",
        choices=list(INPUT_MODES),
        default="File",
        help="File: the channel copied whole before training; FastFile: mounted from S3, read as it is used "
        "(docs/streaming.md; local mode copies it whole)",
    )
    p.add_argument("--output", required=True, help="where each job's folder goes: a directory, file://... or s3://...")
    p.add_argument("--role", default=None, help="SageMaker execution role ARN (needed in the cloud)")
    p.add_argument("--job-name", default="lightning", help="job name prefix; a timestamp is appended")
    p.add_argument(
        "--source-dir",
        default=None,
        help="your project's directory, shipped with the job (default: the image's example)",
    )
    p.add_argument("--entry-point", default="train.py", help="with --source-dir: the script in it that trains")
    p.add_argument(
        "--sdk", choices=["v2", "v3"], default=None, help="SageMaker SDK API (default: the installed major version)"
    )
    p.add_argument(
        "--distribution", choices=list(DISTRIBUTIONS), default="none", help="how SageMaker starts the processes"
    )
    p.add_argument(
        "--processes-per-host", type=int, default=None, help="for the distributions (default: one per GPU, or 1)"
    )
    p.add_argument(
        "--launcher",
        choices=["lightning", "torchrun"],
        default="lightning",
        help="without a distribution: Lightning starts the per-device processes, or torchrun (c10d) does",
    )
    p.add_argument(
        "--checkpoints",
        default=None,
        help="where last.ckpt lives across restarts: s3://... (checkpoint_s3_uri; "
        "default: <output>/<job>/checkpoints/), or a directory in local mode",
    )
    p.add_argument(
        "--spot", action="store_true", help="managed spot training: resumes from --checkpoints when interrupted"
    )
    p.add_argument("--max-run", type=int, default=24 * 3600, help="seconds of training before SageMaker stops the job")
    p.add_argument(
        "--keep-alive",
        type=int,
        default=None,
        metavar="SECONDS",
        help="keep the instances in a warm pool this long after the job (0-3600): a matching next job starts on "
        "them, its warm-pool cache kept (README: Warm pools; the account's quota for warm pools is 0 by default)",
    )
    p.add_argument(
        "--max-wait",
        type=int,
        default=None,
        help="with --spot: seconds including waits for capacity (≥ --max-run; default 2 × it)",
    )
    p.add_argument(
        "--max-retry-attempts",
        type=int,
        default=None,
        help="restarts after interruptions or internal errors (--spot: default 3)",
    )
    p.add_argument(
        "--tensorboard",
        default=None,
        help="s3://... for TensorBoard logs written during training (else in output.tar.gz)",
    )
    p.add_argument(
        "--mlflow",
        default=None,
        metavar="URI",
        help="track the job in MLflow: MLFLOW_TRACKING_URI in its environment, an http(s) URL or a SageMaker MLflow "
        "tracking server's or app's ARN (one run per job, across restarts: README, Experiment tracking)",
    )
    p.add_argument(
        "--network-isolation",
        action="store_true",
        help="no network access from the containers (data through channels only)",
    )
    p.add_argument("--subnets", default=None, help="comma-separated VPC subnet IDs")
    p.add_argument(
        "--security-groups",
        default=None,
        help="comma-separated security group IDs (multi-node: one that admits itself)",
    )
    p.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="a tag of the job (repeatable)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable of the job (repeatable)",
    )
    p.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="val/NAME | NAME=REGEX",
        help="a CloudWatch metric besides the runtime's (repeatable): a val/ metric the project logs, read from the "
        "validation line, or a whole definition",
    )
    p.add_argument(
        "--wait", action=argparse.BooleanOptionalAction, default=True, help="wait for the job and stream its logs"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the request as JSON and send nothing (cloud): CreateTrainingJob, with tune "
        "CreateHyperParameterTuningJob",
    )
    p.add_argument(
        "hyperparameters", nargs="*", metavar="key=value", help="trainer arguments, e.g. trainer.max_epochs=5"
    )
    if tune:
        add_tuning(p.add_argument_group("the tuning job (docs/cloud.md: Tuning)"))
    args = p.parse_args(argv[1:] if tune else argv)
    args.tune = tune
    return args


def add_tuning(g) -> None:
    g.add_argument(
        "--objective", required=True, help="the metric SageMaker ranks children by: a metric definition's name"
    )
    way = g.add_mutually_exclusive_group(required=True)
    way.add_argument("--maximize", action="store_true", default=argparse.SUPPRESS, help="higher is better (accuracy)")
    way.add_argument(
        "--minimize", action="store_false", dest="maximize", default=argparse.SUPPRESS, help="lower is better (loss)"
    )
    g.add_argument(
        "--range",
        action="append",
        default=[],
        metavar="KEY=LOW:HIGH[:SCALE] | KEY=A,B,C",
        help="a setting to tune (repeatable): integer bounds make an integer range, others a continuous one; SCALE: "
        "auto, linear, log, reverse-log; A,B,C: categorical choices, each sent as its text",
    )
    g.add_argument("--strategy", choices=STRATEGIES, default="Bayesian", help="how SageMaker picks the settings")
    g.add_argument("--max-jobs", type=int, default=None, help="children the tuning job starts (Grid: every setting)")
    g.add_argument("--max-parallel-jobs", type=int, default=1, help="children at a time")
    g.add_argument(
        "--early-stopping", choices=["auto", "off"], default="off", help="auto: SageMaker stops unpromising children"
    )
    g.add_argument(
        "--warm-start",
        default=None,
        metavar="PARENT[,PARENT]",
        help="up to 5 earlier tuning jobs of the same image and data to start from (IdenticalDataAndAlgorithm)",
    )
