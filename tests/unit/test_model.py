"""The classifier: torchvision models by name, the CIFAR stem, and loading a job's model directory."""

import pytest
import torch
from torch import nn

import model
from sagemaker_lightning import UserError


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
