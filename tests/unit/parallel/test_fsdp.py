"""trainer.strategy=fsdp (sagemaker_lightning/parallel/fsdp.py): the strategy each launcher gets, in either Lightning
package; the settings as hyperparameters; the one-line refusals; sharding itself in one real gloo process; a
lightning.pytorch project trained, saved, resumed and exported under fsdp in this process (the rules of sharded
saves: checkpoints/test_sharded_saves.py)."""

import os
from datetime import timedelta

import lightning.pytorch
import pytest
import pytorch_lightning
import torch
import torch.distributed as dist
import torchvision

import train
from model import ImageClassifier
from sagemaker_lightning.checkpoints import sharded_saves
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch import hyperparameters
from sagemaker_lightning.launch.plan import make_plan
from sagemaker_lightning.parallel import fsdp, fsdp_sharding, strategy
from sagemaker_lightning.progress import weights_digest
from sagemaker_lightning.toolbox.lightning_package import attribute, made

pytestmark = pytest.mark.unit

HOSTS = {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2", "SM_NUM_GPUS": "0"}
TORCHRUN = {"TORCHELASTIC_RUN_ID": "job", "LOCAL_WORLD_SIZE": "1", "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
MPIRUN = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
MPIRUN.update(OMPI_COMM_WORLD_LOCAL_SIZE="1", SM_CURRENT_HOST="algo-1")  # mpirun exports the first host's
CPU = {"strategy": "fsdp", "accelerator": "cpu", "precision": "bf16-mixed"}
PACKAGES = {"lightning.pytorch": lightning.pytorch, "pytorch_lightning": pytorch_lightning}
LAUNCHERS = {  # launcher: (environment, cluster environment; None: Lightning detects its own)
    "laptop": ({}, None),
    "process": (HOSTS, "LightningEnvironment"),  # one process per host: the toolkit, SDK 3.x's basic driver
    "mpirun": ({**HOSTS, **MPIRUN}, "LightningEnvironment"),  # pytorchddp, smdistributed, mpi
    "torchrun": ({**HOSTS, **TORCHRUN}, "TorchElasticEnvironment"),  # torch_distributed, SDK 3.x's Torchrun()
}


def fsdp_arguments(pl, env=HOSTS, trainer_config=CPU, **settings):
    plan = make_plan(env, {"eth0"}, accelerator=trainer_config.get("accelerator"), timeout_s=42)
    arguments = strategy.arguments(pl, plan, trainer_config, [], fsdp.FSDPSettings(**settings))
    return plan, arguments


@pytest.mark.parametrize("package", PACKAGES)
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_each_launcher_gets_its_cluster_environment_and_timeout_in_either_package(package, launcher):
    env, cluster = LAUNCHERS[launcher]
    pl = PACKAGES[package]
    plan, arguments = fsdp_arguments(pl, env, sharding_strategy="HYBRID_SHARD", activation_checkpointing=True)
    assert plan.launcher == ("none" if launcher == "laptop" else launcher)
    (chosen,) = arguments.values()
    assert isinstance(chosen, fsdp.FullyShardedStrategy)
    assert isinstance(chosen, attribute(pl, "strategies.ModelParallelStrategy"))  # of the project's own package
    if cluster:
        assert type(chosen.cluster_environment) is attribute(pl, f"plugins.environments.{cluster}")
    else:
        assert chosen.cluster_environment is None
    assert chosen._timeout == timedelta(seconds=42)
    assert chosen.settings == fsdp.FSDPSettings("HYBRID_SHARD", None, True, False, None)


def test_the_backend_follows_the_device_nccl_on_gpus_gloo_on_cpus():
    _, arguments = fsdp_arguments(pytorch_lightning)
    chosen = arguments["strategy"]
    chosen.parallel_devices = [torch.device("cpu")]
    assert chosen._get_process_group_backend() == "gloo"
    chosen.parallel_devices = [torch.device("cuda", 0)]  # only read here: no GPU needed
    assert chosen._get_process_group_backend() == "nccl"


@pytest.mark.parametrize(
    "env, trainer_config, settings, message",
    [
        (
            {**HOSTS, "SM_FRAMEWORK_PARAMS": '{"sagemaker_distributed_dataparallel_enabled": true}'},
            CPU,
            {},
            "SMDDP does not run trainer.strategy=fsdp .* use distribution torch_distributed or pytorchddp",
        ),
        (HOSTS, {**CPU, "precision": "16-mixed"}, {}, "trainer.precision=16-mixed does not work with"),
        (HOSTS, CPU, {"cpu_offload": True}, "fsdp.cpu_offload moves shards off the GPU"),
    ],
)
def test_combinations_fsdp_cannot_run_fail_in_one_line(env, trainer_config, settings, message):
    """SMDDP is refused before its import: the line names the real problem on every image flavor."""
    with pytest.raises(UserError, match=message) as e:
        fsdp_arguments(pytorch_lightning, env, trainer_config, **settings)
    assert "\n" not in str(e.value)


def test_fsdp_settings_are_hyperparameters_dotted_or_nested(archive_dir):
    """Typed as hyperparameters.json holds them, through the example's CLI; the rest of the trainer is as with ddp."""
    given = {
        "trainer.strategy": "fsdp",
        "fsdp.auto_wrap_policy": ["CNBlock", "my.Block"],
        "fsdp": {"sharding_strategy": "SHARD_GRAD_OP", "activation_checkpointing": True, "mixed_precision": "bf16"},
    }
    argv = [hyperparameters.argument(k, v) for k, v in given.items()]
    cli = train.main(["--data.data_dir", archive_dir, "--trainer.accelerator", "cpu", *argv], run=False)
    assert isinstance(cli.trainer.strategy, fsdp.FullyShardedStrategy)
    expected = fsdp.FSDPSettings("SHARD_GRAD_OP", ["CNBlock", "my.Block"], True, False, "bf16")
    assert cli.trainer.strategy.settings == expected


def test_mesh_shards_over_all_processes_or_within_each_host():
    assert fsdp_sharding.mesh_shape("FULL_SHARD", 2, 8) == (16,)
    assert fsdp_sharding.mesh_shape("SHARD_GRAD_OP", 2, 8) == (16,)
    assert fsdp_sharding.mesh_shape("HYBRID_SHARD", 2, 8) == (2, 8)  # replicate across hosts, shard within one


@pytest.mark.parametrize(
    "arch, block",
    [
        ("resnet50", "Bottleneck"),
        ("wide_resnet50_2", "Bottleneck"),
        ("vit_b_16", "EncoderBlock"),
        ("convnext_tiny", "CNBlock"),
        ("swin_v2_t", "SwinTransformerBlockV2"),
        ("efficientnet_v2_s", "MBConv"),
        ("mobilenet_v3_small", "InvertedResidual"),
        ("densenet121", "_DenseLayer"),
    ],
)
def test_the_default_policy_finds_torchvision_blocks(arch, block):
    with torch.device("meta"):  # the structure only: no memory, no initialisation
        net = torchvision.models.get_model(arch, weights=None)
    found = fsdp_sharding.blocks(net, fsdp_sharding.TORCHVISION_BLOCKS)
    assert found and block in {type(m).__name__ for m in found}
    inner_first = [m for m in net.modules() if m in found][::-1]
    assert found == inner_first  # FSDP2 shards children before their parents


def test_a_class_is_named_by_its_name_or_its_module_path():
    block = torchvision.models.convnext.CNBlock(8, 0.0, 1e-6)
    assert fsdp_sharding.matches(block, ["CNBlock"]) and fsdp_sharding.matches(
        block, ["torchvision.models.convnext.CNBlock"]
    )
    assert not fsdp_sharding.matches(block, ["Block", "other.CNBlock"])


@pytest.mark.parametrize("checkpointing", [False, True])
def test_sharded_weights_consolidate_into_the_plain_models_state_dict(one_process, checkpointing):
    torch.manual_seed(0)
    model = ImageClassifier("resnet18", channels_last=True)  # channels-last weights: made contiguous to shard
    plain = {k: v.clone() for k, v in model.state_dict().items()}
    settings = fsdp.FSDPSettings(activation_checkpointing=checkpointing)
    found, roots = fsdp_sharding.shard(model, settings, one_process, offload=False)
    assert len(found) == 8 and roots == ["net"]  # ResNet-18's BasicBlocks, then the rest of the network
    state = made(fsdp.FullyShardedStrategy, pytorch_lightning)(settings).full_state_dict(model)
    assert state.keys() == plain.keys()  # no FSDP or checkpoint-wrapper names
    assert all(torch.equal(state[k], plain[k]) for k in plain)
    ImageClassifier("resnet18").load_state_dict(state)  # strict: the unsharded model takes it as it is


def test_optimizers_made_before_sharding_step_the_sharded_parameters(one_process):
    model = ImageClassifier("resnet18")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # as LightningCLI makes it, before fit
    unsharded = {id(p): (n, p) for n, p in model.named_parameters()}
    fsdp_sharding.shard(model, fsdp.FSDPSettings(activation_checkpointing=True), one_process, offload=False)
    fsdp_sharding.rebind([optimizer], unsharded, dict(model.named_parameters()))
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == [id(p) for p in model.parameters()]


def test_a_wrap_policy_that_names_no_module_fails_in_one_line(one_process):
    settings = fsdp.FSDPSettings(auto_wrap_policy=["DecoderLayer"])
    with pytest.raises(UserError, match=r"fsdp.auto_wrap_policy=\['DecoderLayer'\] names no module of the model"):
        fsdp_sharding.shard(ImageClassifier(), settings, one_process, offload=False)


def test_with_offload_the_shards_stay_and_the_metrics_move(one_process):
    """fsdp.cpu_offload: the sharded network stays in host memory, everything else goes to the device (seen on an
    H100: metrics left behind failed the first step)."""
    model = ImageClassifier("resnet18")
    fsdp_sharding.shard(model, fsdp.FSDPSettings(), one_process, offload=False)
    fsdp_sharding.to_device_unsharded(model, torch.device("meta"))  # a device that needs no GPU
    assert {p.device.type for p in model.net.parameters()} == {"cpu"}
    assert model.val_loss.mean_value.device.type == "meta" and model.val_acc.tp.device.type == "meta"


def test_weights_of_any_dtype_have_a_digest():
    """bf16-true weights (numpy has no bfloat16): the digest reads their bytes."""
    net = torch.nn.Linear(2, 2)
    assert weights_digest(net.to(torch.bfloat16)) != weights_digest(net.float())


def test_a_lightning_pytorch_project_trains_resumes_and_exports_under_fsdp(tmp_path, capsys):
    """The runtime's LightningCLI with lightning.pytorch classes, one process: sharded last.ckpt saves, the newest
    resumed by the next run, model.pt with the plain model's keys and tensors. checkpoint.save_last=true (a plain
    Lightning setting) adds no whole-file copy beside the sharded last.ckpt/, and the process group is gone once the
    run has ended (not left to the interpreter's finalization, where gloo can abort a finished job)."""
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

    from sagemaker_lightning import LightningCLI

    def fit(steps: int):
        args = ["fit", "--trainer.strategy=fsdp", "--trainer.accelerator=cpu", "--trainer.devices=1"]
        args += [f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=0", "--trainer.logger=false"]
        args += [f"--checkpoint.dirpath={tmp_path / 'ckpts'}", "--last_checkpoint_every_n_steps=2"]
        args += [f"--model_dir={tmp_path / 'model'}", "--trainer.enable_progress_bar=false"]
        args += ["--checkpoint.save_last=true"]
        return LightningCLI(BoringModel, BoringDataModule, args=args, save_config_callback=None)

    cli = fit(3)
    assert isinstance(cli.trainer.strategy, lightning.pytorch.strategies.ModelParallelStrategy)
    assert not dist.is_initialized()
    assert "checkpoint.save_last=True is not needed" in capsys.readouterr().out
    assert [n for n in os.listdir(tmp_path / "ckpts") if n.startswith("last")] == ["last.ckpt"]
    saves = sorted(os.listdir(tmp_path / "ckpts" / "last.ckpt"))  # the save at step 3 and the one before it
    assert [n[:14] for n in saves] == ["step-000000002", "step-000000003"]
    assert all(sharded_saves.missing(tmp_path / "ckpts" / "last.ckpt" / n) == [] for n in saves)
    fit(5)
    assert "resuming at epoch 0 step 3 from last.ckpt" in capsys.readouterr().out
    state = torch.load(tmp_path / "model" / "model.pt", weights_only=True)
    assert {k: (type(v), tuple(v.shape)) for k, v in state.items()} == {
        "layer.weight": (torch.Tensor, (2, 32)),
        "layer.bias": (torch.Tensor, (2,)),
    }


def test_a_second_save_at_a_step_replaces_that_steps_save_not_the_one_before(tmp_path):
    """At an epoch's end last.ckpt is saved, then saved again once ModelCheckpoint has updated its state; under fsdp
    the second save replaces the first, and the save of the step before stays (two saves of one step were kept, the
    older step's pruned: nothing to fall back on if the newest came back from S3 incomplete)."""
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

    from sagemaker_lightning import LightningCLI

    args = ["fit", "--trainer.strategy=fsdp", "--trainer.accelerator=cpu", "--trainer.devices=1"]
    args += ["--trainer.max_epochs=2", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
    args += ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.num_sanity_val_steps=0"]
    args += [f"--checkpoint.dirpath={tmp_path}", "--last_checkpoint_every_n_steps=0"]
    LightningCLI(BoringModel, BoringDataModule, args=args, save_config_callback=None)
    saves = sorted(os.listdir(tmp_path / "last.ckpt"))
    assert [n[:14] for n in saves] == ["step-000000002", "step-000000004"], saves
