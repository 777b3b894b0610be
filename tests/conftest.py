"""Fixtures shared by every tier: generated CIFAR-10-format data and the repository's paths."""

import os

import pytest

import make_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = os.path.join(ROOT, "app")


@pytest.fixture(scope="session")
def archive_dir(tmp_path_factory) -> str:
    """A directory holding cifar-10-python.tar.gz with 160 training and 40 test images."""
    out = str(tmp_path_factory.mktemp("cifar-archive"))
    make_dataset.synthetic(out, train=160, test=40, seed=0)
    return out
