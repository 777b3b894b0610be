"""The start-up path imports no torch: every module of boot/ (PID 1, the start-up hook every Python process of the
image runs) and launch/ (the launch plan, the platforms, hyperparameters, the paths, the instance table), the failure
table and the log lines, and the other modules named below. Each is imported in a fresh interpreter where torch and Lightning cannot be imported at all,
and the hook is run on a SageMaker host's environment."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

PACKAGE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "app", "sagemaker_lightning"
)
WHOLE = ("boot", "launch")  # the rooms of PID 1, the start-up hook and the launch plan: every module of theirs
LIGHT = (
    "sagemaker_lightning",
    *sorted(
        "sagemaker_lightning."
        + os.path.relpath(os.path.join(folder, name), PACKAGE)[:-3].replace(os.sep, ".").removesuffix(".__init__")
        for room in WHOLE
        for folder, _, names in os.walk(os.path.join(PACKAGE, room))
        for name in names
        if name.endswith(".py")
    ),
    "sagemaker_lightning.failure",
    "sagemaker_lightning.lines",
    "sagemaker_lightning.goodput",  # its ledger and line: torch-free (the attempt's start is launch/started.py's)
    "sagemaker_lightning.toolbox.lightning_package",
    "sagemaker_lightning.cli.quiet",
    "sagemaker_lightning.toolbox.concern",  # the concerns' shape: no torch until a concern's own module
    "sagemaker_lightning.health.efa",
    # the watchdog's and the pre-flight's pure parts, cut from their torch-bound callers to be read and tested alone
    "sagemaker_lightning.health.heartbeats",
    "sagemaker_lightning.health.preflight_verdict",
    "sagemaker_lightning.health.signing",
    "sagemaker_lightning.health.store_link",
    "sagemaker_lightning.health.stragglers",
    "sagemaker_lightning.toolbox.status",
    "sagemaker_lightning.stop.restarts",
    "sagemaker_lightning.checkpoints.layout",
    "sagemaker_lightning.checkpoints.interval",  # when last.ckpt is due: a rule without a trainer
    "sagemaker_lightning.checkpoints.retention",  # which saves stay: a rule and its file operations
    "sagemaker_lightning.toolbox.location",
    "sagemaker_lightning.tracking.uri",  # its URI check runs in scripts/run_sagemaker.py too, where no torch is
    "sagemaker_lightning.tracking.record",
    "sagemaker_lightning.tracking.mlflow_client",
    "sagemaker_lightning.tracking.mlflow_run",
    "sagemaker_lightning.tracking.tracker",
)
HEAVY = ("torch", "lightning", "pytorch_lightning", "lightning_fabric", "numpy")  # none of them on the start-up path

# Any import of HEAVY fails, naming the module that asked for it
BLOCK = textwrap.dedent(
    f"""
    import importlib.abc, sys, traceback
    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in {HEAVY!r}:
                importer = [f.filename for f in traceback.extract_stack() if "sagemaker_lightning" in f.filename]
                raise ImportError(f"{{name}} imported by {{importer[-1] if importer else '?'}}")
    sys.meta_path.insert(0, Refuse())
    """
)


def run(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        # none of the variables earlier tests left here; PYTHONPATH where it names the package's checkout
        env={"PATH": os.environ["PATH"], **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}, **(env or {})},
    )


@pytest.mark.parametrize("module", LIGHT)
def test_the_module_imports_without_torch(module):
    done = run(f"import importlib; importlib.import_module({module!r}); print('imported')")
    assert done.returncode == 0 and done.stdout.strip() == "imported", done.stderr


def test_the_start_up_hook_applies_the_plan_without_torch(tmp_path):
    """On the second host of a SageMaker job the hook sets the rank variables, importing none of HEAVY. In a tuning
    job's child, the toolkit's process then reads hyperparameters.json (seven times and more a host) without its line
    that SageMaker's own _tuning_objective_metric is not JSON (text, by design); a project's text value keeps it."""
    env = {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2", "SM_NUM_GPUS": "0"}
    env["SAGEMAKER_BASE_DIR"] = str(tmp_path)
    (tmp_path / "input" / "config").mkdir(parents=True)
    hyperparameters = {"_tuning_objective_metric": "validation:accuracy", "note": "a text", "lr": "0.1"}
    (tmp_path / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    done = run(
        """
        import logging, os, sagemaker_lightning.boot.autoenv
        print(os.environ['NODE_RANK'], os.environ['WORLD_SIZE'])
        from sagemaker_training import environment  # as the toolkit's process reads the hyperparameters
        logging.basicConfig(level=logging.INFO)
        environment.read_hyperparameters()
        """,
        env,
    )
    assert done.returncode == 0 and done.stdout.split() == ["1", "2"], done.stderr
    said = [line for line in done.stderr.splitlines() if "Failed to parse hyperparameter" in line]
    assert len(said) == 1 and "note" in said[0], done.stderr


def test_the_guard_itself_catches_an_import_of_torch():
    """The check can fail: a module that imports torch is named."""
    done = run("import sagemaker_lightning.progress")
    assert done.returncode != 0 and "torch imported by" in done.stderr and "progress.py" in done.stderr


def test_the_toolkits_framework_module_reads_torchs_version_without_importing_it():
    """The image's SAGEMAKER_TRAINING_MODULE (toolkit.py) sets SM_DLC_TORCH_VERSION as the PyTorch toolkit's would,
    torch.__version__, but from torch's version.py: the toolkit's process no longer imports torch."""
    import torch

    done = subprocess.run(
        [sys.executable, "-c", "import os, sys; from sagemaker_lightning.boot import toolkit; toolkit.set_torch_version(); "
         "print(os.environ['SM_DLC_TORCH_VERSION'], 'torch' in sys.modules)"],
        capture_output=True, text=True, env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.split() == [torch.__version__, "False"], done.stderr
