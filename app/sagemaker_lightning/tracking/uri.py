"""Where a job's run goes: the tracking URI a job names, checked before anything trains (an http(s) URL or a
SageMaker MLflow tracking server's or app's ARN), and the experiment of its run. No torch: scripts/run_sagemaker.py
checks --mlflow with it too.

    python -c "from sagemaker_lightning.tracking.uri import check_uri; check_uri('http://127.0.0.1:5000')"
"""

import re
from urllib.parse import urlsplit

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.toolbox.redact import shown_url

DEFAULT_EXPERIMENT = "sagemaker-lightning"  # a run's experiment when nothing names one and no job name is known
ARN = re.compile(r"arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:\d{12}:mlflow-(tracking-server|app)/[A-Za-z0-9][A-Za-z0-9-]*")
SDK_STAMP = re.compile(r"-\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2}-\d{3}$")  # what the SDKs append to a job's base name


def check_uri(uri: str) -> str:
    """`uri` when it is an http(s) URL or a SageMaker MLflow ARN; else a UserError naming the forms."""
    if uri.startswith("arn:"):
        if not ARN.fullmatch(uri):
            raise UserError(
                f"the MLflow tracking URI {uri} is not a SageMaker MLflow ARN: expected arn:aws:sagemaker:<region>:"
                "<12-digit account>:mlflow-tracking-server/<name> or ...:mlflow-app/<id> (copy it from the console "
                "or `aws sagemaker list-mlflow-tracking-servers`)"
            )
        return uri
    try:
        parts = urlsplit(uri)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0 and " " not in uri
    except ValueError:  # a port that is not a number
        ok = False
    if not ok:
        raise UserError(
            f"the MLflow tracking URI {shown_url(uri)} is neither an http(s) URL (http://host:5000) nor a SageMaker "
            "MLflow ARN (arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name>); set "
            "MLFLOW_TRACKING_URI or mlflow.tracking_uri to one"
        )
    return uri


def experiment_name(setting: str | None, env, own: str | None, job: str | None) -> str:
    """The setting, MLFLOW_EXPERIMENT_NAME, a project's MLFlowLogger's (not Lightning's default), the job's base
    name (SDK_STAMP removed), or DEFAULT_EXPERIMENT."""
    own = None if own == "lightning_logs" else own
    return setting or env.get("MLFLOW_EXPERIMENT_NAME") or own or (job and SDK_STAMP.sub("", job)) or DEFAULT_EXPERIMENT
