"""dist_timeout reaches the process group whatever the strategy: every strategy Lightning knows by name that takes
a timeout (ddp and its variants, fsdp, deepspeed) and a strategy object the configuration built."""

import inspect
from datetime import timedelta

import pytest
import pytorch_lightning as pl
from pytorch_lightning.strategies import DDPStrategy, StrategyRegistry

from sagemaker_lightning.launch.plan import make_plan
from sagemaker_lightning.parallel import strategy

pytestmark = pytest.mark.unit

PLAN = make_plan({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-1"}, (), timeout_s=42)
TIMED = [
    name for name in StrategyRegistry if "timeout" in inspect.signature(StrategyRegistry[name]["strategy"]).parameters
]


def test_the_strategies_that_take_a_timeout_are_the_distributed_ones():
    assert {"ddp", "ddp_find_unused_parameters_true", "ddp_spawn", "fsdp", "fsdp_cpu_offload", "deepspeed"} <= set(
        TIMED
    )


@pytest.mark.parametrize("name", TIMED)
def test_every_named_strategy_gets_the_timeout(name, monkeypatch):
    """Built as Lightning builds it from the name, with the plan's wiring (DeepSpeed's class cannot be built without
    deepspeed installed: its __init__ records the arguments instead)."""
    cls = StrategyRegistry[name]["strategy"]
    if "deepspeed" in name:
        built = {}

        def record(self, *, timeout=None, cluster_environment=None, process_group_backend=None, **settings):
            built.update(timeout=timeout, cluster_environment=cluster_environment)

        monkeypatch.setattr(cls, "__init__", record)
        strategy.arguments(pl, PLAN, {"strategy": name}, [])
    else:
        made = strategy.arguments(pl, PLAN, {"strategy": name}, [])["strategy"]
        built = {"timeout": made._timeout, "cluster_environment": made.cluster_environment}
    assert built["timeout"] == timedelta(seconds=42)
    assert type(built["cluster_environment"]).__name__ == "LightningEnvironment"


def test_a_strategy_object_gets_the_timeout_it_left_unset():
    mine = DDPStrategy()
    assert strategy.arguments(pl, PLAN, {"strategy": mine}, []) == {}
    assert mine._timeout == timedelta(seconds=42)
    theirs = DDPStrategy(timeout=timedelta(seconds=7))
    strategy.arguments(pl, PLAN, {"strategy": theirs}, [])
    assert theirs._timeout == timedelta(seconds=7)  # set by the project: kept
