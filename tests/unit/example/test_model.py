"""The classifier: torchvision models by name, the CIFAR stem, and loading a job's model directory."""

import pytest
import torch
from torch import nn

import model
from sagemaker_lightning import UserError

pytestmark = pytest.mark.unit


def test_resnet_gets_the_cifar_stem():
    m = model.ImageClassifier("resnet18", num_classes=10)
    assert m.net.conv1.kernel_size == (3, 3) and m.net.conv1.stride == (1, 1)
    assert isinstance(m.net.maxpool, nn.Identity)
    assert m(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_stem_can_be_turned_off():
    m = model.ImageClassifier("resnet18", cifar_stem=False)
    assert m.net.conv1.kernel_size == (7, 7) and isinstance(m.net.maxpool, nn.MaxPool2d)


def test_any_torchvision_classifier_by_name():
    m = model.ImageClassifier("mobilenet_v3_small", num_classes=5)
    assert m(torch.zeros(2, 3, 32, 32)).shape == (2, 5)


def test_unknown_arch_is_a_user_error():
    with pytest.raises(UserError, match="model.arch='resnet1000' is not a torchvision classification model"):
        model.ImageClassifier("resnet1000")


def test_from_model_dir_round_trip(tmp_path):
    trained = model.ImageClassifier("resnet18", num_classes=7)
    torch.save(trained.state_dict(), tmp_path / "model.pt")
    (tmp_path / "config.yaml").write_text(
        "model:\n  arch: resnet18\n  cifar_stem: true\ndata:\n  class_path: data.CIFAR10DataModule\n  init_args:\n    num_classes: 7\n"
    )
    loaded = model.ImageClassifier.from_model_dir(str(tmp_path))
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(loaded(x), trained.eval()(x))


def test_channels_last_changes_the_memory_order_not_the_function():
    torch.manual_seed(0)
    plain = model.ImageClassifier("resnet18").eval()
    fast = model.ImageClassifier("resnet18", channels_last=True).eval()
    fast.load_state_dict(plain.state_dict())
    assert fast.net.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(fast(x), plain(x), rtol=1e-4, atol=1e-4)


def test_compiled_weights_keep_their_names(tmp_path):
    """model.pt of a compiled run loads into an uncompiled model (torch.compile's wrapper would prefix _orig_mod.)."""
    compiled = model.ImageClassifier("resnet18", num_classes=7, compile=True)
    assert list(compiled.state_dict()) == list(model.ImageClassifier("resnet18", num_classes=7).state_dict())
    torch.save(compiled.state_dict(), tmp_path / "model.pt")
    (tmp_path / "config.yaml").write_text(
        "model:\n  arch: resnet18\n  cifar_stem: true\n  channels_last: true\n  compile: true\n"
        "data:\n  class_path: device_data.DeviceCIFAR10DataModule\n  init_args:\n    num_classes: 7\n"
    )
    loaded = model.ImageClassifier.from_model_dir(str(tmp_path))
    assert loaded.hparams.compile is False and loaded.hparams.channels_last is True


def test_warmup_then_half_cosine_to_zero():
    factors = [model.warmup_cosine(step, total=10, warmup=2) for step in range(11)]
    assert factors[:3] == [0.5, 1.0, 1.0]  # linear warm-up (1/2, 2/2), then the cosine from its top
    assert all(a > b for a, b in zip(factors[2:], factors[3:], strict=False))  # falling at every step after
    assert factors[6] == pytest.approx(0.5)  # half-way through the cosine
    assert 0 < factors[9] < 0.04 and factors[10] == pytest.approx(0)  # near 0 at the last step, 0 after it


def test_the_schedule_steps_per_optimizer_step_over_the_runs_length(archive_dir, tmp_path):
    """trainer.yaml's schedule in a real run: 2 epochs of 3 steps (limit_train_batches) are 6 optimizer steps, the
    warm-up is 20 % of them; the learning rate changes after every step, and last.ckpt holds the schedule's step."""
    import pytorch_lightning as pl

    import train

    class Rates(pl.Callback):
        seen = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.seen.append(trainer.optimizers[0].param_groups[0]["lr"])

    argv = ["--data.data_dir", archive_dir, "--data.val_split", "0", "--data.batch_size", "16"]
    argv += ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1"]
    argv += ["--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--trainer.enable_progress_bar", "false"]
    argv += ["--model.arch", "mobilenet_v3_small"]  # the schedule is the point, not the network: a small one
    argv += ["--logger.save_dir", str(tmp_path), "--checkpoint.dirpath", str(tmp_path / "ckpt")]
    cli = train.main(argv, run=False)
    cli.trainer.callbacks.append(Rates())
    cli.trainer.fit(cli.model, cli.datamodule)
    assert Rates.seen == pytest.approx([0.1 * model.warmup_cosine(step, total=6, warmup=1) for step in range(6)])
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert checkpoint["lr_schedulers"][0]["last_epoch"] == 6
