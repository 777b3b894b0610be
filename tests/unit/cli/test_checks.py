"""What the runtime's LightningCLI checks around building the trainer (cli/checks.py): the trainer's world is the
job's."""

import pytest

from sagemaker_lightning.cli.checks import check_world_size
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch.plan import make_plan

pytestmark = pytest.mark.unit

HOSTS = {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2"}
TORCHRUN = {
    **HOSTS,
    "TORCHELASTIC_RUN_ID": "x",
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
}


def plan(env, interfaces=("lo", "eth0"), **settings):
    return make_plan(env, interfaces, **settings)


def test_world_size_check():
    check_world_size(plan({}), 1, 1)  # outside a job: nothing to check
    check_world_size(plan(HOSTS), 2, 1)
    with pytest.raises(UserError, match="trainer.num_nodes=1 but the job has 2 hosts"):
        check_world_size(plan(HOSTS), 1, 1)
    with pytest.raises(UserError, match="trainer.devices=1 but the launcher started 2 processes per host"):
        check_world_size(plan(TORCHRUN), 2, 1)
