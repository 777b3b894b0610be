"""SageMaker's hyperparameters as the trainer's arguments, read from the job's typed hyperparameters.json.

Every launcher renders the same hyperparameters its own way: the training toolkit (SDK 2.x, the image's own
entrypoint) as `--key value` with dicts as `k=v,k2=v2` and lists as Python's repr, SDK 3.x's driver as `--key <JSON>`.
Rather than guess back from those strings, the runtime takes each value from hyperparameters.json — what the SDK
sent, a JSON string per key (SDK 2.x's Estimator sends Python's str() instead: True, None, {'a': 1}) — and gives it
to jsonargparse as `--key=<JSON>`. Dotted keys (`trainer.max_epochs`) and nested groups (`trainer: {max_epochs: 3}`,
which jsonargparse merges into the group) mean the same thing. SageMaker's own keys never reach the project: those
starting with `sagemaker_` (framework parameters; a tuning job's sagemaker_estimator_*) and `_tuning_objective_metric`,
the objective's name SageMaker adds to each child of a tuning job (`objective` reads it).

    SM_INPUT_CONFIG_DIR=/opt/ml/input/config python -c "from sagemaker_lightning.launch import hyperparameters as h; import os; print(h.projects(h.sent(os.environ)))"
"""

import ast
import json
from collections.abc import Mapping
from typing import Any

from sagemaker_lightning.launch import paths

FRAMEWORK_PREFIX = "sagemaker_"  # SageMaker's own parameters (sagemaker_program, sagemaker_submit_directory, ...)
TUNING_OBJECTIVE = "_tuning_objective_metric"  # the objective's name, in every child of a tuning job (SageMaker's)
SMDDP = "sagemaker_distributed_dataparallel_enabled"  # the framework parameter of distribution smdistributed
# the framework parameters of the distributions SageMaker runs with mpirun: pytorchddp, smdistributed, mpi
MPI_RUNNERS = ("sagemaker_mpi_enabled", "sagemaker_pytorch_ddp_enabled", SMDDP)


def typed(value: Any) -> Any:
    """A hyperparameter value as the user gave it: JSON (SDK 3.x, framework estimators), else a Python literal
    (SDK 2.x's str(): True, None, [1, 2], {'a': 1}), else the string itself."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


def enabled(parameters: Mapping[str, Any], key: str) -> bool:
    """Whether framework parameter `key` is on, in whichever form it came (true, "true", "True", '"true"')."""
    return str(typed(parameters.get(key, ""))).lower() == "true"


def sagemakers(key: str) -> bool:
    """Whether hyperparameter `key` is SageMaker's own, never the project's option."""
    return key.startswith(FRAMEWORK_PREFIX) or key == TUNING_OBJECTIVE


def sent(env: Mapping[str, str]) -> dict[str, Any]:
    """hyperparameters.json as the SDK sent it; {} where there is none (or it is not a JSON object). Read once per
    process: the plan holds what the runtime takes from it (plan.Plan.hyperparameters, .objective)."""
    try:
        with open(paths.hyperparameters_file(env)) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def projects(sent: Mapping[str, Any]) -> dict[str, Any]:
    """The job's hyperparameters (`sent`'s), typed, without SageMaker's own."""
    return {k: typed(v) for k, v in sent.items() if not sagemakers(k)}


def objective(sent: Mapping[str, Any]) -> str | None:
    """The objective a tuning job ranks this child by (`validation:accuracy`) among the hyperparameters `sent`; None:
    not a tuning job's child."""
    value = typed(sent.get(TUNING_OBJECTIVE))
    return str(value) if value not in (None, "") else None


def argument(key: str, value: Any) -> str:
    """`--key=value` as jsonargparse reads it: strings as they are, everything else as JSON (null, true, lists,
    dicts), so that a string holding `=` or `,` stays a string."""
    return f"--{key}={value if isinstance(value, str) else json.dumps(value)}"


def merge(argv: list[str], hyperparameters: Mapping[str, Any]) -> list[str]:
    """argv with each `--key value` pair whose key is a hyperparameter replaced by its typed value, and SageMaker's
    own parameters left out (SDK 3.x's driver passes every key); other words (a subcommand, the user's own options)
    stay where they are."""
    out, skip = [], False
    for i, word in enumerate(argv):
        if skip:
            skip = False
            continue
        key = word[2:] if word.startswith("--") else None
        if key is not None and i + 1 < len(argv) and (key in hyperparameters or sagemakers(key)):
            if key in hyperparameters:
                out.append(argument(key, hyperparameters[key]))
            skip = True  # the launcher's rendering of the value
        else:
            out.append(word)
    return out
