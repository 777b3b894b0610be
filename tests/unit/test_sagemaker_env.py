"""The SageMaker environment → trainer settings and rank variables, as pure functions."""

import json

import pytest

import sagemaker_env as sm
from failure import UserError

HOSTS = {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2"}
ADDRESSES = {"algo-1": "10.0.0.1", "algo-2": "10.0.0.2"}


def launch(env, nprocs=1, interfaces=("lo", "eth0")):
    return sm.launch_env(env, nprocs, resolve=ADDRESSES.__getitem__, interfaces=interfaces)


def test_cluster_gives_hosts_and_node_rank():
    assert sm.cluster(HOSTS) == (["algo-1", "algo-2"], 1)


@pytest.mark.parametrize(
    "hosts, current, message",
    [
        ("algo-1", "algo-1", "not a JSON list"),
        ('"algo-1"', "algo-1", "not a JSON list"),
        ("[]", "algo-1", "not a JSON list"),
        ('["algo-1", ""]', "algo-1", "not a JSON list"),
        ('["algo-1","algo-1"]', "algo-1", "names a host twice"),
        ('["algo-1","algo-2"]', "algo-3", "SM_CURRENT_HOST='algo-3' is not in SM_HOSTS"),
        ('["algo-1"]', "", "SM_CURRENT_HOST='' is not in SM_HOSTS"),
    ],
)
def test_cluster_rejects_bad_hosts(hosts, current, message):
    with pytest.raises(UserError, match=message):
        sm.cluster({"SM_HOSTS": hosts, "SM_CURRENT_HOST": current})


def test_launch_env_sets_rendezvous_from_first_host():
    env = launch({**HOSTS, "SM_NUM_GPUS": "4"}, nprocs=4)
    assert env["MASTER_ADDR"] == "10.0.0.1"
    assert env["MASTER_PORT"] == sm.DEFAULT_MASTER_PORT
    assert env["NODE_RANK"] == "1"
    assert env["WORLD_SIZE"] == "8"  # processes, not hosts


def test_launch_env_keeps_the_rest_and_respects_a_given_port():
    env = launch({**HOSTS, "MASTER_PORT": "7777", "PATH": "/bin"})
    assert env["MASTER_PORT"] == "7777" and env["PATH"] == "/bin"


def test_launch_env_never_leaves_local_rank():
    assert "LOCAL_RANK" not in launch({**HOSTS, "LOCAL_RANK": "0"})


def test_launch_env_names_the_interface_only_when_it_exists():
    env = launch({**HOSTS, "SM_NETWORK_INTERFACE_NAME": "eth0"})
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"
    env = launch({**HOSTS, "SM_NETWORK_INTERFACE_NAME": "ethwe"})  # what SDK v3 local mode writes
    assert "NCCL_SOCKET_IFNAME" not in env and "GLOO_SOCKET_IFNAME" not in env


def test_launch_env_keeps_the_users_interface_choice():
    env = launch({**HOSTS, "SM_NETWORK_INTERFACE_NAME": "eth0", "NCCL_SOCKET_IFNAME": "^docker0,lo"})
    assert env["NCCL_SOCKET_IFNAME"] == "^docker0,lo" and env["GLOO_SOCKET_IFNAME"] == "eth0"


def test_launch_env_reports_an_unresolvable_first_host():
    def resolve(host):
        raise OSError("Name or service not known")

    with pytest.raises(UserError, match="cannot resolve the first host 'algo-1'"):
        sm.launch_env(HOSTS, 1, resolve=resolve, interfaces=())


@pytest.mark.parametrize(
    "env, argv, expected",
    [
        ({}, [], 1),
        ({"SM_NUM_GPUS": "0"}, [], 1),
        ({"SM_NUM_GPUS": "8"}, [], 8),
        ({"SM_NUM_GPUS": "8"}, ["--trainer.devices", "2"], 2),
        ({"SM_NUM_GPUS": "8"}, ["--trainer.devices=[0, 1, 2]"], 3),
        ({"SM_NUM_GPUS": "8"}, ["--trainer.devices", "auto"], 8),
        ({"SM_NUM_GPUS": "8"}, ["--trainer.devices", "-1"], 8),
        ({"SM_NUM_GPUS": "8"}, ["--trainer.accelerator", "cpu"], 1),
        ({"SM_NUM_GPUS": "0"}, ["--trainer.accelerator", "cpu", "--trainer.devices", "2"], 2),
        ({}, ["--trainer.devices", "1", "--trainer.devices", "3"], 3),
    ],
)
def test_devices_per_host(env, argv, expected):
    assert sm.devices(env, argv) == expected


def sagemaker(tmp="/sm", channels=("training",), **extra):
    env = {
        **HOSTS,
        "SM_NUM_GPUS": "0",
        "SM_CHANNELS": json.dumps(list(channels)),
        "SM_OUTPUT_DATA_DIR": f"{tmp}/output/data",
        "SM_MODEL_DIR": f"{tmp}/model",
        "SAGEMAKER_BASE_DIR": tmp,
    }
    env.update({f"SM_CHANNEL_{c.upper()}": f"{tmp}/input/data/{c}" for c in channels})
    env.update(extra)
    return env


def test_trainer_args_outside_sagemaker_are_none():
    assert sm.trainer_args({"PATH": "/bin"}, ["--trainer.devices", "2"]) == []


def test_trainer_args_put_the_trainer_on_the_cluster_and_paths():
    assert sm.trainer_args(sagemaker(), []) == [
        "--trainer.num_nodes=2",
        "--trainer.devices=1",
        "--data.data_dir=/sm/input/data/training",
        "--checkpoint.dirpath=/sm/checkpoints",
        "--logger.save_dir=/sm/output/data/tensorboard",
        "--model_dir=/sm/model",
    ]


def test_trainer_args_use_one_device_per_gpu():
    assert "--trainer.devices=8" in sm.trainer_args(sagemaker(SM_NUM_GPUS="8"), [])


def test_checkpoints_default_to_opt_ml():
    env = sagemaker()
    del env["SAGEMAKER_BASE_DIR"]
    assert "--checkpoint.dirpath=/opt/ml/checkpoints" in sm.trainer_args(env, [])


def test_the_data_channel_is_configurable():
    env = sagemaker(channels=("train", "extra"), DATA_CHANNEL="train")
    assert "--data.data_dir=/sm/input/data/train" in sm.trainer_args(env, [])


def test_a_missing_data_channel_is_named():
    with pytest.raises(UserError, match="no input channel 'training' \\(it has train\\).*DATA_CHANNEL"):
        sm.trainer_args(sagemaker(channels=("train",)), [])


def test_no_channels_leave_data_dir_alone():
    assert not any(a.startswith("--data.data_dir") for a in sm.trainer_args(sagemaker(channels=()), []))


def test_world_size_check():
    sm.check_world_size({}, 1, 1)  # outside SageMaker: nothing to check
    sm.check_world_size({**HOSTS, "WORLD_SIZE": "4"}, 2, 2)
    with pytest.raises(UserError, match="trainer.num_nodes=1 but the job has 2 hosts"):
        sm.check_world_size(HOSTS, 1, 1)
    with pytest.raises(UserError, match="WORLD_SIZE=4 but trainer.num_nodes × trainer.devices = 2 × 1"):
        sm.check_world_size({**HOSTS, "WORLD_SIZE": "4"}, 2, 1)


def test_sagemaker_values_turn_none_into_null():
    argv = ["--a", "None", "--b", "", "--c", "True", "--d", "False", "--e", "x"]
    assert sm.sagemaker_values(argv) == ["--a", "null", "--b", "null", "--c", "True", "--d", "False", "--e", "x"]
