"""Secrets out of model_dir's config.yaml (redact.py): which keys and strings count as secret, what stays as it was,
and the config.yaml a fit writes (issue 37: a key or a user:password@ URI given as a hyperparameter landed in
model.tar.gz).

    .venv/bin/python -m pytest tests/unit/toolbox/test_redact.py -q
"""

import os

import pytest
import yaml
from lightning.pytorch.demos.boring_classes import BoringModel

import train
from sagemaker_lightning import LightningCLI
from sagemaker_lightning.toolbox.redact import REDACTED, redacted, redacted_text, redacted_yaml, secret_key

pytestmark = pytest.mark.unit

KEY_ID = "AKIAIOSFODNN7EXAMPLE"  # AWS's documented example access key id
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documented example secret access key


@pytest.mark.parametrize(
    "key",
    ["password", "db_password", "DB_PASSWD", "wandb.api_key", "apiKey", "api-key", "hf_token", "token", "accessToken"]
    + ["aws_secret_access_key", "secretAccessKey", "client_secret", "private_key", "credentials", "auth", "auth_header"]
    + ["X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "sig", "passphrase", "Authorization"],
)
def test_keys_that_name_a_secret(key):
    assert secret_key(key)


@pytest.mark.parametrize(
    "key",
    ["lr", "max_tokens", "token_dropout", "pad_token", "eos_token", "tokenizer", "keys", "key", "author", "oauth_scope"]
    + ["arch", "num_classes", "dirpath", "monkey", "access_log", "primary_key"],
)
def test_keys_that_do_not(key):
    assert not secret_key(key)


def test_a_secret_keys_value_goes_whole_and_nothing_else_changes():
    config = {
        "model": {"arch": "resnet18", "lr": 0.1, "hf_token": "hf_abc", "pad_token": "<pad>", "max_tokens": 512},
        "logger": {"init_args": {"api_key": 12345, "credentials": {"user": "u", "key": "k"}, "save_dir": "logs"}},
        "data": {"password": None, "auth_token": "", "use_auth_token": True, "urls": ["s3://b/x", "s3://b/y"]},
    }
    assert redacted(config) == {
        "model": {"arch": "resnet18", "lr": 0.1, "hf_token": REDACTED, "pad_token": "<pad>", "max_tokens": 512},
        "logger": {"init_args": {"api_key": REDACTED, "credentials": REDACTED, "save_dir": "logs"}},
        # unset, empty, a bool: nothing secret in them, and a loader reading them back gets what it gave
        "data": {"password": None, "auth_token": "", "use_auth_token": True, "urls": ["s3://b/x", "s3://b/y"]},
    }


@pytest.mark.parametrize(
    "given, expected",
    [
        ("postgres://user:pw@db.example.com:5432/x", f"postgres://{REDACTED}@db.example.com:5432/x"),
        ("https://ghp_abc@github.com/o/r.git", f"https://{REDACTED}@github.com/o/r.git"),
        ("mysql://u:p@ss@db/x", f"mysql://{REDACTED}@db/x"),  # an @ left unencoded in the password
        ("https://host/x?next=a@b", "https://host/x?next=a@b"),  # an @ after the host: not user information
        ("see https://u:p@a/b and ftp://v:q@c", f"see https://{REDACTED}@a/b and ftp://{REDACTED}@c"),
        (
            f"https://b.s3.amazonaws.com/k?X-Amz-Credential={KEY_ID}%2F20260101&X-Amz-Signature=ab12&X-Amz-Expires=60",
            f"https://b.s3.amazonaws.com/k?X-Amz-Credential={REDACTED}&X-Amz-Signature={REDACTED}&X-Amz-Expires=60",
        ),
        (f"key id {KEY_ID} here", f"key id {REDACTED} here"),
        ("s3://bucket/data?versionId=3", "s3://bucket/data?versionId=3"),  # nothing secret: as it was
        ("user@example.com", "user@example.com"),  # no scheme: not a URL's user information
        (SECRET, SECRET),  # no fixed form: redacted only under a key that names it (the previous test)
    ],
)
def test_strings_lose_a_urls_user_information_secret_query_values_and_access_key_ids(given, expected):
    assert redacted_text(given) == expected
    assert redacted({"model": {"source": given}}) == {"model": {"source": expected}}


def test_a_configuration_without_secrets_is_dumped_as_it_was():
    text = "# lightning.pytorch==2.6.0\nmodel:\n  arch: resnet18\n  lr: 0.001\n  note: null\n  betas:\n  - 0.9\n  - 0.99\ndata:\n  name: \u00e9t\u00e9\n"
    assert redacted_yaml(text) == text


def test_the_examples_configuration_keeps_every_setting(archive_dir):
    """The example's resolved configuration has no secret: its config.yaml rebuilds the model as before
    (ImageClassifier.from_model_dir: test_model.py)."""
    cli = train.main(["--data.data_dir", archive_dir], run=False)
    assert cli._config_yaml() == cli._parser(cli.subcommand).dump(cli._subconfig(), skip_none=False)


class Fetching(BoringModel):
    """A project that takes a token and a source URL with a password, as hyperparameters."""

    def __init__(self, hf_token: str = "", source: str = "", width: int = 32):
        super().__init__()
        self.save_hyperparameters()


def test_the_config_yaml_a_fit_writes_holds_no_secret(tmp_path, monkeypatch):
    for name in [n for n in os.environ if n.startswith(("SM_", "SAGEMAKER_"))]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    given = [
        "--model.hf_token=hf_SeCrEt",
        "--model.source=https://alice:pa55w0rd@data.example.com/set",
        "--model.width=7",
    ]
    tiny = ["--trainer.max_steps=1", "--trainer.limit_val_batches=0", "--trainer.logger=false"]
    LightningCLI(Fetching, args=["fit", *given, *tiny, f"--model_dir={tmp_path / 'model'}"], save_config_callback=None)
    text = (tmp_path / "model" / "config.yaml").read_text()
    assert "hf_SeCrEt" not in text and "pa55w0rd" not in text and "alice" not in text
    model = yaml.safe_load(text)["model"]
    assert model == {"hf_token": REDACTED, "source": f"https://{REDACTED}@data.example.com/set", "width": 7}


HF = "hf_" + "aB3" * 11 + "c"  # a Hugging Face token's form: hf_ and 34 letters and digits
GHP = "ghp_" + "x9Y" * 12  # a GitHub personal access token's: ghp_ and 36
SK = "sk-proj-" + "Ab1_" * 10  # an OpenAI key's
AIZA = "AIza" + "Sy" + "D4-x_" * 6 + "abc"  # a Google API key's: AIza and 35


@pytest.mark.parametrize(
    "given, expected",
    [
        # an env list's KEY=value of secret keys; the others as they were
        ({"env": [f"HF_TOKEN={HF}", "WANDB_API_KEY=0123abcd", "OMP_NUM_THREADS=4"]},
         {"env": [f"HF_TOKEN={REDACTED}", f"WANDB_API_KEY={REDACTED}", "OMP_NUM_THREADS=4"]}),
        # options inside a string, with = and with a space
        ({"command": f"python fetch.py --token={GHP} --password hunter2 --lr 0.1"},
         {"command": f"python fetch.py --token={REDACTED} --password {REDACTED} --lr 0.1"}),
        ({"command": "login --password 'two words' --user bob"}, {"command": f"login --password {REDACTED} --user bob"}),
        # keys
        ({"db_pass": "hunter2", "pwd": "hunter2", "privatekey": "k", "sessiontoken": "t", "DB_PASS": "x"},
         {"db_pass": REDACTED, "pwd": REDACTED, "privatekey": REDACTED, "sessiontoken": REDACTED, "DB_PASS": REDACTED}),
        ({"hf_tokens": ["a1", "b2"]}, {"hf_tokens": REDACTED}),
        ({"wandb": {"key": "0123abcd", "project": "p"}}, {"wandb": {"key": REDACTED, "project": "p"}}),
        ({"wandb_key": "0123abcd"}, {"wandb_key": REDACTED}),
        # a URL's query and fragment
        ({"url": f"https://maps.example.com/api?key={AIZA}&zoom=3"},
         {"url": f"https://maps.example.com/api?key={REDACTED}&zoom=3"}),
        ({"url": "https://app.example.com/cb#access_token=ya29.abc&token_type=Bearer"},
         {"url": f"https://app.example.com/cb#access_token={REDACTED}&token_type=Bearer"}),
        ({"url": "https://api.example.com/v1?key=plainkey"}, {"url": f"https://api.example.com/v1?key={REDACTED}"}),
        # values of a fixed form under neutral keys
        ({"model": {"source": HF, "note": f"pushed by {GHP}", "client": SK, "maps": AIZA}},
         {"model": {"source": REDACTED, "note": f"pushed by {REDACTED}", "client": REDACTED, "maps": REDACTED}}),
        ({"remote": f"https://{GHP}@github.com/o/r.git"}, {"remote": f"https://{REDACTED}@github.com/o/r.git"}),
    ],
    ids=["env list", "options", "quoted option", "keys", "hf_tokens", "wandb.key", "wandb_key", "?key=AIza",
         "#access_token", "?key=", "forms under neutral keys", "a URL's user"],
)  # fmt: skip
def test_the_forms_redaction_missed(given, expected):
    """Issue 48, item 8: each of these reached model_dir's config.yaml (and the MLflow run's parameters) as given."""
    assert redacted(given) == expected


@pytest.mark.parametrize(
    "given",
    [
        {"pad_token": "<pad>", "eos_token": "</s>", "special_tokens": ["<pad>", "<s>"], "max_tokens": 512},
        {"max_new_tokens": 64, "stop_tokens": ["###"], "num_tokens": 10, "tokenizer": "gpt2"},
        {"forward_pass": 2, "first_pass": "fast", "data": {"key": "jpg", "image_key": "png"}, "sort": {"key": "loss"}},
        {"env": ["OMP_NUM_THREADS=4", "PAD_TOKEN=<pad>", "PATH=/usr/bin"], "args": "--lr 0.1 --max_tokens 5 -p 3"},
        {"libs": ["hf_transfer", "sk-learn", "task-sk-abcdefghijklmnopqrstuvwxyz"], "ghp": "ghp_short"},
        {"url": "https://host/x?version=3#section", "cache": "/models/hf_cache_dir", "name": "mask-rcnn"},
    ],
    ids=["a vocabulary's tokens", "counts of tokens", "passes over data and data keys", "env and options",
         "lookalikes too short or inside a word", "URLs and paths"],
)  # fmt: skip
def test_what_only_looks_like_those_forms_stays(given):
    """Issue 48, item 8: the new forms take nothing else: a vocabulary's pad_token, counts, data keys, short
    lookalikes."""
    assert redacted(given) == given
