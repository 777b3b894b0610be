"""One set of versions: environment.yml (the conda flavor) pins what pyproject.toml's groups pin."""

import os

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pins(requirements) -> dict[str, str]:
    parsed = [Requirement(r) for r in requirements if isinstance(r, str)]
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in parsed), "pin with =="
    return {r.name: str(r.specifier) for r in parsed}


def test_environment_yml_pins_the_groups_it_is_made_of():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        groups = tomllib.load(f)["dependency-groups"]
    with open(os.path.join(ROOT, "environment.yml")) as f:
        conda = yaml.safe_load(f)["dependencies"]
    (pip,) = [d["pip"] for d in conda if isinstance(d, dict)]
    assert pins(pip) == {**pins(groups["torch-smddp"]), **pins(groups["train"])}
    assert "python=3.11" in conda  # the SMDDP wheel's Python (docker/Dockerfile, SMDDP_WHEEL)


def test_every_group_pins_exact_versions():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        for requirements in tomllib.load(f)["dependency-groups"].values():
            pins(requirements)
