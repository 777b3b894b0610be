"""SageMaker's hyperparameters reach the trainer with their types, whichever SDK sent them and whichever launcher
rendered them: through the real conversions (SDK 2.x's to_string, SDK 3.x's safe_serialize, the toolkit's JSON
decoding and to_cmd_args, SDK 3.x's driver's hyperparameters_to_cli_args) and the example's real parser."""

import importlib.util
import json
import os
import sys

import pytest
from sagemaker.utils import to_string
from sagemaker_training import environment, mapping

import train
from sagemaker_lightning.launch import hyperparameters

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SDK3 = os.path.join(ROOT, ".venv-sdk3", "lib", f"python{sys.version_info.major}.{sys.version_info.minor}", "site-packages",
                    "sagemaker", "train", "container_drivers", "common", "utils.py")  # fmt: skip


def sdk3_driver():
    """SDK 3.x's driver utilities (stdlib only), loaded from .venv-sdk3: the code that runs in the container."""
    spec = importlib.util.spec_from_file_location("sdk3_driver_utils", SDK3)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sdk2(tmp_path, monkeypatch, hps: dict) -> list[str]:
    """SDK 2.x's Estimator → hyperparameters.json → the toolkit's argv; the runtime reads the same file."""
    (tmp_path / "hyperparameters.json").write_text(json.dumps({k: to_string(v) for k, v in hps.items()}))
    monkeypatch.setattr(environment, "hyperparameters_file_dir", str(tmp_path / "hyperparameters.json"))
    return mapping.to_cmd_args(environment.read_hyperparameters())


def sdk3(tmp_path, monkeypatch, hps: dict) -> list[str]:
    """SDK 3.x's ModelTrainer → hyperparameters.json → its driver's argv."""
    driver = sdk3_driver()
    (tmp_path / "hyperparameters.json").write_text(json.dumps({k: driver.safe_serialize(v) for k, v in hps.items()}))
    return driver.hyperparameters_to_cli_args(json.loads((tmp_path / "hyperparameters.json").read_text()))


# the same settings, dotted and nested; every kind of value
DOTTED = {
    "trainer.max_epochs": 3,
    "trainer.enable_progress_bar": False,
    "trainer.max_time": None,
    "data.val_split": 0.25,
    "optimizer": "Adam",
    "optimizer.betas": [0.8, 0.9],
    "model.arch": "resnet18",
    "checkpoint.filename": "best={epoch},run=a",  # a string holding = and ,
    "checkpoint.monitor": "val/acc",
}
NESTED = {
    "trainer": {"max_epochs": 3, "enable_progress_bar": False, "max_time": None},
    "data": {"init_args": {"val_split": 0.25}},
    "optimizer": {"class_path": "Adam", "init_args": {"betas": [0.8, 0.9]}},
    "model": {"arch": "resnet18"},
    "checkpoint": {"filename": "best={epoch},run=a", "monitor": "val/acc"},
}


def parsed(argv: list[str], typed: dict) -> dict:
    config = train.main(hyperparameters.merge(argv, typed), run=False).config
    return {
        "max_epochs": config.trainer.max_epochs,
        "progress_bar": config.trainer.enable_progress_bar,
        "max_time": config.trainer.max_time,
        "val_split": config.data.init_args.val_split,
        "optimizer": config.optimizer.class_path,
        "betas": list(config.optimizer.init_args.betas),
        "filename": config.checkpoint.filename,
        "monitor": config.checkpoint.monitor,
    }


EXPECTED = {
    "max_epochs": 3,
    "progress_bar": False,
    "max_time": None,
    "val_split": 0.25,
    "optimizer": "torch.optim.Adam",
    "betas": [0.8, 0.9],
    "filename": "best={epoch},run=a",
    "monitor": "val/acc",
}


# SDK 3.x's driver stops on a dotted key before any code runs (README): run_sagemaker.py nests them for it
@pytest.mark.parametrize(
    "launcher, form",
    [(sdk2, DOTTED), (sdk2, NESTED), (sdk3, NESTED)],
    ids=["SDK 2.x + toolkit, dotted", "SDK 2.x + toolkit, nested", "SDK 3.x driver, nested"],
)
def test_every_form_on_every_launcher_means_the_same(tmp_path, monkeypatch, launcher, form):
    argv = launcher(tmp_path, monkeypatch, form)
    typed = hyperparameters.projects(hyperparameters.sent({"SM_INPUT_CONFIG_DIR": str(tmp_path)}))
    assert typed == form
    assert parsed(argv, typed) == EXPECTED


def test_by_hand_without_sagemaker(tmp_path):
    argv = [hyperparameters.argument(k, v) for k, v in DOTTED.items()]
    assert parsed(argv, {}) == EXPECTED


@pytest.mark.parametrize(
    "sent, value",
    [
        ("3", 3),
        ("True", True),  # SDK 2.x's str(True)
        ("None", None),
        ("null", None),
        ("{'a': 1, 'b': [1, 2]}", {"a": 1, "b": [1, 2]}),  # SDK 2.x's str() of a dict
        ('{"a": 1}', {"a": 1}),
        ("[[1, 2], [3]]", [[1, 2], [3]]),
        ("https://x.example/a?b=c,d", "https://x.example/a?b=c,d"),
        ("resnet18", "resnet18"),
        (7, 7),
    ],
)
def test_typed_values(sent, value):
    assert hyperparameters.typed(sent) == value


def test_merge_replaces_only_the_launcher_s_rendering():
    argv = ["fit", "--trainer.max_epochs", "3", "--mine", "x", "--data", "k=v,k2=v2", "--sagemaker_program", "t.py"]
    typed = {"trainer.max_epochs": 3, "data": {"k": "v", "k2": "v2"}}
    assert hyperparameters.merge(argv, typed) == [
        "fit",
        "--trainer.max_epochs=3",
        "--mine",
        "x",
        '--data={"k": "v", "k2": "v2"}',
    ]


def test_sagemaker_s_own_parameters_are_not_arguments(tmp_path):
    (tmp_path / "hyperparameters.json").write_text(json.dumps({"sagemaker_program": '"train.py"', "a": "1"}))
    assert hyperparameters.projects(hyperparameters.sent({"SM_INPUT_CONFIG_DIR": str(tmp_path)})) == {"a": 1}
    assert hyperparameters.projects(hyperparameters.sent({"SM_INPUT_CONFIG_DIR": str(tmp_path / "none")})) == {}


CHILD = {"trainer.max_epochs": 3, "optimizer.lr": "0.05", "_tuning_objective_metric": "validation:accuracy"}


@pytest.mark.parametrize("launcher", [sdk2, sdk3], ids=["SDK 2.x + toolkit", "SDK 3.x driver"])
def test_a_tuning_childs_objective_is_sagemakers_not_an_option(tmp_path, monkeypatch, launcher):
    """SageMaker adds _tuning_objective_metric to each child's hyperparameters; SDK 3.x's driver passes it on as
    `--_tuning_objective_metric validation:accuracy`, which the project's parser would refuse."""
    argv = launcher(tmp_path, monkeypatch, CHILD)
    env = {"SM_INPUT_CONFIG_DIR": str(tmp_path)}
    typed = hyperparameters.projects(hyperparameters.sent(env))
    assert typed == {"trainer.max_epochs": 3, "optimizer.lr": 0.05}
    assert hyperparameters.objective(hyperparameters.sent(env)) == "validation:accuracy"
    assert not any("_tuning_objective_metric" in word for word in hyperparameters.merge(argv, typed))


def test_a_job_without_an_objective_is_no_tuning_child(tmp_path):
    (tmp_path / "hyperparameters.json").write_text(json.dumps({"a": "1", "_tuning_objective_metric": '""'}))
    assert hyperparameters.objective(hyperparameters.sent({"SM_INPUT_CONFIG_DIR": str(tmp_path)})) is None
    assert hyperparameters.objective(hyperparameters.sent({"SM_INPUT_CONFIG_DIR": str(tmp_path / "none")})) is None
