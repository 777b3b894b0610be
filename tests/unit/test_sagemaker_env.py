"""The SageMaker environment → trainer settings and rank variables, as pure functions."""

import json

import pytest

import sagemaker_env as sm
from failure import UserError

HOSTS = {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2"}
ADDRESSES = {"algo-1": "10.0.0.1", "algo-2": "10.0.0.2"}


def launch(env, nprocs=1, interfaces=("lo", "eth0"), argv=()):
    return sm.launch_env(env, nprocs, resolve=ADDRESSES.__getitem__, interfaces=interfaces, argv=argv)


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


@pytest.mark.parametrize(
    "given, expected_nccl, expected_gloo",
    [
        ({"SM_NETWORK_INTERFACE_NAME": "eth0"}, "eth0", "eth0"),
        ({"SM_NETWORK_INTERFACE_NAME": "ethwe"}, None, None),  # what SDK v3 local mode writes
        # the PyTorch toolkit passes the missing name on: unset it, gloo and NCCL pick an interface
        ({"SM_NETWORK_INTERFACE_NAME": "ethwe", "NCCL_SOCKET_IFNAME": "ethwe"}, None, None),
        ({"SM_NETWORK_INTERFACE_NAME": "eth0", "NCCL_SOCKET_IFNAME": "ethwe"}, "eth0", "eth0"),
        # what the user or the launcher set and what exists here stays
        ({"SM_NETWORK_INTERFACE_NAME": "eth0", "NCCL_SOCKET_IFNAME": "^docker0,lo"}, "^docker0,lo", "eth0"),
        ({"SM_NETWORK_INTERFACE_NAME": "eth0", "NCCL_SOCKET_IFNAME": "eth"}, "eth", "eth0"),  # NCCL: a prefix
        ({"SM_NETWORK_INTERFACE_NAME": "eth0", "GLOO_SOCKET_IFNAME": "lo"}, "eth0", "lo"),
        ({"SM_NETWORK_INTERFACE_NAME": "eth0", "GLOO_SOCKET_IFNAME": "eth"}, "eth0", "eth0"),  # gloo: exact names
        ({"SM_NETWORK_INTERFACE_NAME": "eth0", "NCCL_SOCKET_IFNAME": "=eth"}, "eth0", "eth0"),
    ],
)
def test_interface_rules(given, expected_nccl, expected_gloo):
    env = launch({**HOSTS, **given})
    assert env.get("NCCL_SOCKET_IFNAME") == expected_nccl and env.get("GLOO_SOCKET_IFNAME") == expected_gloo


@pytest.mark.parametrize(
    "instance_type, preset, argv, expected",
    [
        ("local", {}, [], {}),
        ("ml.g5.2xlarge", {}, [], {}),  # no EFA
        ("ml.g5.48xlarge", {}, [], {"FI_PROVIDER": "efa", "FI_EFA_USE_HUGE_PAGE": "0"}),
        ("ml.p4d.24xlarge", {}, [], {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0"}),
        (
            "ml.p4de.24xlarge",
            {},
            [],
            {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0"},
        ),
        ("ml.p5.48xlarge", {}, ["--data.num_workers", "0"], {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}),
        ("ml.p5en.48xlarge", {}, ["--data.num_workers=0"], {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}),
        (
            "ml.p6-b200.48xlarge",
            {},
            [],
            {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0"},
        ),
        (
            "ml.trn1.32xlarge",
            {},
            ["--data.num_workers", "2"],
            {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0"},
        ),
        # set by the user or by mpirun's -x: kept
        ("ml.p4d.24xlarge", {"FI_PROVIDER": "tcp", "FI_EFA_USE_HUGE_PAGE": "1"}, [], {"FI_EFA_USE_DEVICE_RDMA": "1"}),
    ],
)
def test_efa_settings_by_instance_type(instance_type, preset, argv, expected):
    env = {**HOSTS, "SM_CURRENT_INSTANCE_TYPE": instance_type, **preset}
    efa_keys = ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_USE_HUGE_PAGE")
    assert {k: v for k, v in sm.network_env(env, ("eth0",), argv).items() if k in efa_keys} == expected
    assert all(launch(env, argv=argv)[k] == v for k, v in preset.items())


def test_launcher_detection():
    assert sm.launcher(HOSTS) == "process"
    assert sm.launcher({**HOSTS, "TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "1"}) == "torchrun"
    assert sm.launcher({**HOSTS, "OMPI_COMM_WORLD_RANK": "3"}) == "mpirun"


def test_torchrun_processes_keep_their_ranks():
    torchrun = {
        **HOSTS,
        "TORCHELASTIC_RUN_ID": "x",
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "algo-1",
        "MASTER_PORT": "7777",
    }
    env = launch(torchrun)
    assert {k: env[k] for k in torchrun} == torchrun
    assert sm.devices(env, []) == 2


def mpirun_env(rank, size=4, local_size=2):
    # mpirun exports the first host's environment to every rank: SM_CURRENT_HOST says algo-1 everywhere
    return {
        "SM_HOSTS": '["algo-1","algo-2"]',
        "SM_CURRENT_HOST": "algo-1",
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % local_size),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "PMIX_RANK": str(rank),
    }


@pytest.mark.parametrize("rank, node, host", [(0, 0, "algo-1"), (1, 0, "algo-1"), (2, 1, "algo-2"), (3, 1, "algo-2")])
def test_mpirun_ranks_from_ompi_and_the_host_list(rank, node, host):
    env = launch(mpirun_env(rank))
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (
        str(rank),
        "4",
        str(rank % 2),
        "2",
    )
    assert (env["NODE_RANK"], env["SM_CURRENT_HOST"], env["MASTER_ADDR"]) == (str(node), host, "10.0.0.1")
    assert not any(k.startswith(("OMPI_", "PMIX_")) for k in env)  # train.py is not an MPI process
    assert sm.devices(env, []) == 2
    sm.check_world_size(env, 2, 2)


def test_mpirun_with_uneven_hosts_is_named():
    with pytest.raises(UserError, match="mpirun started 3 processes, not 2 on each of 2 hosts"):
        launch(mpirun_env(0, size=3))


def test_train_command_runs_train_py_or_torchrun():
    env = launch({**HOSTS, "TRAINING_JOB_NAME": "job-1"}, nprocs=4)
    assert sm.train_command(env, 4, "py", "train.py", ["--a", "1"]) == ["py", "train.py", "--a", "1"]
    assert sm.train_command({**env, "LAUNCHER": "torchrun"}, 4, "py", "train.py", ["--a", "1"]) == [
        "py",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=4",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=10.0.0.1:29500",
        "--rdzv_id=job-1",
        "--max_restarts=0",
        "train.py",
        "--a",
        "1",
    ]
    # under a launcher that already started one process per device, LAUNCHER=torchrun adds nothing
    torchrun = {**env, "LAUNCHER": "torchrun", "TORCHELASTIC_RUN_ID": "x"}
    assert sm.train_command(torchrun, 4, "py", "train.py", []) == ["py", "train.py"]
    with pytest.raises(UserError, match="LAUNCHER='deepspeed' is not one of lightning, torchrun"):
        sm.train_command({**env, "LAUNCHER": "deepspeed"}, 4, "py", "train.py", [])


def test_smddp_is_enabled_by_the_framework_parameter():
    assert not sm.smddp_enabled({})
    assert not sm.smddp_enabled({"SM_FRAMEWORK_PARAMS": '{"sagemaker_mpi_enabled": true}'})
    assert sm.smddp_enabled({"SM_FRAMEWORK_PARAMS": '{"sagemaker_distributed_dataparallel_enabled": true}'})


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
        ({"SM_NUM_GPUS": "8", "LOCAL_WORLD_SIZE": "4"}, [], 4),  # what torchrun or mpirun started
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
    with pytest.raises(UserError, match="trainer.devices=1 but the launcher started 2 processes per host"):
        sm.check_world_size({**HOSTS, "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, 2, 1)


def test_sagemaker_values_turn_none_into_null():
    argv = ["--a", "None", "--b", "", "--c", "True", "--d", "False", "--e", "x"]
    assert sm.sagemaker_values(argv) == ["--a", "null", "--b", "null", "--c", "True", "--d", "False", "--e", "x"]


@pytest.mark.parametrize(
    "message, expected",
    [
        (
            "Timed out after 16 seconds waiting for clients. 1/2 clients joined.",
            "only 1 of 2 processes joined within 16 s: the other hosts (algo-1) did not start training or cannot reach 10.0.0.1:29500",
        ),
        (
            "The client socket has timed out after 600000ms while trying to connect to (10.0.0.1, 29500). connect() timed out.",
            "could not reach the first host algo-1 at 10.0.0.1:29500 within dist_timeout",
        ),
        (
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.1]:40339",
            "lost the connection to host algo-1 during training",
        ),
        (
            "[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation to complete",
            "a collective operation did not finish within dist_timeout: a process on another host (algo-1) stopped or hangs",
        ),
        ("CUDA error: an illegal memory access was encountered", None),
    ],
)
def test_peer_failures_name_the_host(message, expected):
    env = {**HOSTS, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    line = sm.peer_failure(env, message, ADDRESSES.__getitem__)
    assert line == expected if expected is None else expected in line
