"""MLflow's client as a job's run uses it (mlflow_run.py): made with bounded requests, its failures sorted into what
to retry and what to give up, and the keys and values MLflow takes. No torch; mlflow is imported by connect() only.

    python -c "from sagemaker_lightning.tracking import mlflow_client; print(mlflow_client.flat({'a': {'b': [1, 2]}}))"
"""

import functools
import json
import os
import re
from collections.abc import Mapping

# MLflow's settings unless the job sets them: one request's bounds (MLflow's own, 120 s and 7 retries with backoff,
# hold a request for minutes, the end of a job waits for the last one, and urllib3 logs each retry: the thread retries
# instead, quietly); no "View run" line of its own at the end; no usage data sent from a training job to MLflow's
# telemetry service (on by default in MLflow 3.x: a job's network may not reach it, and its owner did not ask)
DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}
MAX_VALUE = 6000  # characters of a parameter's value that MLflow keeps (3.x); a tag's value is cut to the same
# botocore's words, inside MLflow's wrapping, when sagemaker-mlflow cannot sign a request with the job's role
CREDENTIALS = re.compile(r"Unable to locate credentials|ExpiredToken|InvalidClientTokenId|security token included")


def flat(config: Mapping, prefix: str = "") -> dict[str, str]:
    """A nested configuration as dotted keys and string values, as MLflow's parameters hold them: lists and other
    values as JSON, a value cut to MAX_VALUE characters."""
    out = {}
    for name, value in config.items():
        name = key(f"{prefix}{name}")
        if isinstance(value, Mapping) and value:
            out.update(flat(value, name + "."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[name] = text[:MAX_VALUE]
    return out


def kind(e: BaseException) -> str:
    """What a failed request means: "refused" (the credentials: 401, 403, none to sign with), "rejected" (the
    server, or the client's own checks, found the request wrong: another 4xx) or "unreachable" (no answer, a timeout,
    a 5xx, a 429: worth trying again). MLflow raises its transport failures with error_code INTERNAL_ERROR (500), as a
    500 itself."""
    if isinstance(e, FileNotFoundError | PermissionError | IsADirectoryError):  # an artifact's file
        return "rejected"
    code = getattr(e, "error_code", None)
    if code in ("UNAUTHENTICATED", "PERMISSION_DENIED", "CUSTOMER_UNAUTHORIZED") or CREDENTIALS.search(str(e)):
        return "refused"
    status = e.get_http_status_code() if hasattr(e, "get_http_status_code") else 500
    return "rejected" if 400 <= status < 500 and status != 429 else "unreachable"


def why(e: BaseException) -> str:
    """A failed request's reason, short: the socket's error or the timeout inside MLflow's and urllib3's wrapping
    ("[Errno 111] Connection refused"), else the message's first 200 characters."""
    message = " ".join(str(e).split())
    found = re.search(r"\[Errno -?\d+\] [^'\")]+|Read timed out[^'\")]*|timed out", message)
    return found.group(0).strip() if found else message[:200]


@functools.cache  # a job logs the same few names at every step
def key(name: str) -> str:
    """`name` as MLflow takes a metric's or a parameter's key: characters it refuses (a whole request fails on one)
    become "_", at most 250 characters."""
    return re.sub(r"[^/\w.\- :]", "_", name)[:250]


def connect(uri: str):
    """An MlflowClient of `uri`, with DEFAULTS. The process's tracking URI is set to it too: sagemaker-mlflow's plugin
    reads that one, not the client's, for the header that routes a request to the ARN's server. Its header provider,
    called for every server, fails on an http(s) URI (a warning at each request): that warning is not shown there."""
    for name, value in DEFAULTS.items():  # before MLflow reads them
        os.environ.setdefault(name, value)
    import logging

    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(uri)
    if not uri.startswith("arn:"):
        logging.getLogger("mlflow.tracking.request_header.registry").setLevel(logging.ERROR)
    return MlflowClient(uri)
