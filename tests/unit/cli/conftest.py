"""Fixtures of the CLI's unit tests."""

import os

import pytest

from sagemaker_lightning.boot import signals


@pytest.fixture
def on_sagemaker(tmp_path, monkeypatch):
    """This process as a one-host SageMaker job's (the variables it sets are dropped after the test)."""
    job = {"SM_HOSTS": '["localhost"]', "SM_CURRENT_HOST": "localhost", "SM_NUM_GPUS": "0"}
    monkeypatch.setattr(os, "environ", {**os.environ, **job, "SM_OUTPUT_DIR": str(tmp_path)})
    monkeypatch.setattr(signals, "RUN_DIR", str(tmp_path / "run"))
