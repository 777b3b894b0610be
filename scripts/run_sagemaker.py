"""Start a training job on the image with the SageMaker Python SDK: local mode (docker compose) or the cloud.

Hyperparameters follow the options as key=value words; they reach app/train.py as `--key value`.

    python scripts/run_sagemaker.py --image sagemaker-lightning:latest --instance-type local --instance-count 2 \
        --input data/synthetic --output runs trainer.max_epochs=1 trainer.accelerator=cpu
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Local mode needs no AWS account: a region, a dummy role, and no telemetry calls (they fail offline)
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("SAGEMAKER_USER_CONFIG_OVERRIDE", os.path.join(HERE, "sagemaker_config.yaml"))
LOCAL_ROLE = "arn:aws:iam::111111111111:role/service-role/LocalModeRole"


def uri(path: str) -> str:
    """s3:// and file:// as given; a plain path becomes an absolute file:// URI."""
    return path if path.startswith(("s3://", "file://")) else "file://" + os.path.abspath(path)


def hyperparameters(words: list[str]) -> dict[str, str]:
    pairs = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: hyperparameter {word!r} is not key=value, e.g. trainer.max_epochs=5")
        pairs[key] = value
    return pairs


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--image", required=True, help="image URI: a local tag for local mode, an ECR URI for the cloud")
    p.add_argument("--instance-type", default="local", help="local, local_gpu, or an ml.* type")
    p.add_argument("--instance-count", type=int, default=1, help="hosts (containers in local mode)")
    p.add_argument("--input", required=True, help="training data: a directory, file://... or s3://...")
    p.add_argument("--channel", default="training", help="input channel name (the trainer reads DATA_CHANNEL)")
    p.add_argument("--output", required=True, help="where each job's folder goes: a directory, file://... or s3://...")
    p.add_argument("--role", default=None, help="SageMaker execution role ARN (needed in the cloud)")
    p.add_argument("--job-name", default="lightning", help="job name prefix; a timestamp is appended")
    p.add_argument("hyperparameters", nargs="*", metavar="key=value", help="trainer arguments, e.g. trainer.max_epochs=5")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    hps = hyperparameters(args.hyperparameters)
    local = args.instance_type.startswith("local")
    if not local and not args.role:
        raise SystemExit("error: a cloud job needs --role, the ARN of a SageMaker execution role")

    from sagemaker.estimator import Estimator  # slow import: after the argument checks
    from sagemaker.local import LocalSession
    from sagemaker.session import Session

    job_name = f"{args.job_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    output = uri(args.output).rstrip("/")
    if local and output.startswith("file://"):
        output = f"{output}/{job_name}"  # local mode writes straight into the path; SageMaker adds the job folder
    session = LocalSession() if local else Session()
    if local:
        session.config = {"local": {"local_code": True}}
    estimator = Estimator(
        image_uri=args.image,
        role=args.role or LOCAL_ROLE,
        instance_count=args.instance_count,
        instance_type=args.instance_type,
        output_path=output,
        hyperparameters=hps,
        environment={"DATA_CHANNEL": args.channel},
        sagemaker_session=session,
    )
    estimator.fit({args.channel: uri(args.input)}, job_name=job_name)
    model = estimator.model_data
    print(f"model.tar.gz: {model[len('file://'):] if model.startswith('file://') else model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
