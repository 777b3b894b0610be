"""What reaches a job's log (quiet.py): a library's own deprecation notice does not, a warning about the
configuration does; both raised by the real libraries."""

import os
import warnings

import pytest
import pytorch_lightning
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities._pytree import _tree_flatten

from sagemaker_lightning import goodput_file
from sagemaker_lightning.cli import quiet

pytestmark = pytest.mark.unit


def warned(install: bool) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # as if each were the first of its kind in the process
        if install:
            quiet.install()
        _tree_flatten(1)  # Lightning's own use of torch's deprecated LeafSpec, at every training step
        pytorch_lightning.Trainer(accelerator="cpu", precision="16-mixed", logger=False, enable_checkpointing=False)
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("install", [False, True])
def test_a_library_deprecation_is_left_out_and_a_configuration_warning_kept(install):
    messages = warned(install)
    assert any("AMP with fp16 is not supported on CPU" in m for m in messages)  # the project's setting
    assert any("LeafSpec" in m for m in messages) is not install


@pytest.mark.parametrize("install", [False, True])
def test_a_checkpoint_directory_holding_the_goodput_ledger_is_not_warned_about(install, tmp_path):
    """A fresh job's directory holds goodput.json when ModelCheckpoint's setup looks at it (Lightning's own check)."""
    (tmp_path / goodput_file.NAME).write_text("[]")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if install:
            quiet.install()
        ModelCheckpoint(dirpath=tmp_path)._ModelCheckpoint__warn_if_dir_not_empty(str(tmp_path))
    assert any("exists and is not empty" in str(w.message) for w in caught) is not install


def test_sagemaker_sdk_v2_notice_is_left_out(monkeypatch, caplog):
    monkeypatch.delenv("SAGEMAKER_SUPPRESS_V2_WARNING", raising=False)  # restored after the test
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet.install(sdk=True)  # before the SDK's import, as run_sagemaker.py does: `import sagemaker` logs it too
        from sagemaker.deprecations import warn_v2_deprecation

        warn_v2_deprecation("a feature of this test")
    assert caught == [] and "SDK v2" not in caplog.text


def test_the_trainer_leaves_the_environment_as_it_found_it(monkeypatch):
    monkeypatch.delenv("SAGEMAKER_SUPPRESS_V2_WARNING", raising=False)
    with warnings.catch_warnings():
        quiet.install()  # as the runtime's LightningCLI does (Lightning's tests check that none leaks)
    assert "SAGEMAKER_SUPPRESS_V2_WARNING" not in os.environ
