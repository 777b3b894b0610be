"""sagemaker_lightning/data/streaming.py's parts that need no process group or S3: the settings that cannot resume exactly
(one line each), the loader state made this host's, the launch plan's variables for litdata. The chains of stops and
restarts on S3 are in tests/toolkit/test_streaming_toolkit.py; an S3 prefix that cannot be streamed in
tests/cloud/test_upload_data_s3.py and test_streaming_s3.py."""

import os

import numpy as np
import pytest
from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset
from litdata.streaming.writer import BinaryWriter

from sagemaker_lightning import UserError
from sagemaker_lightning.data import streaming
from sagemaker_lightning.launch.plan import make_plan

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def optimized(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("optimized"))
    writer = BinaryWriter(folder, chunk_size=10)
    for i in range(40):
        writer[i] = {"id": i, "x": np.full(4, i, np.float32)}
    writer.done()
    writer.merge()
    return folder


def loader(optimized, tmp_path, *, dataset: dict | None = None, **kwargs):
    made = StreamingDataset(optimized, cache_dir=str(tmp_path / "cache"), **(dataset or {}))
    return StreamingDataLoader(made, batch_size=4, **kwargs)


def test_a_loader_that_can_resume_passes(optimized, tmp_path):
    streaming.check(loader(optimized, tmp_path, dataset={"shuffle": True}), 0, 1, str(tmp_path / "checkpoints"))


@pytest.mark.parametrize(
    "case, rank, world, dataset, kwargs, line",
    [
        ("made before the processes joined", 1, 2, {}, {},
         "a StreamingDataset was made for rank 0 of 1 processes, but this is rank 1 of 2: make it in the data "
         "module's setup() or train_dataloader()"),
        ("overridden state", 0, 1, {"force_override_state_dict": True}, {},
         "StreamingDataset(force_override_state_dict=True) cannot resume exactly"),
        ("cache in the checkpoints", 0, 1, {"cache_dir": "CHECKPOINTS/cache"}, {},
         "the streaming cache CHECKPOINTS/cache is inside the checkpoint directory CHECKPOINTS, which SageMaker uploads"),
    ],
)  # fmt: skip
def test_a_setting_that_cannot_resume_exactly_is_one_line(
    optimized, tmp_path, case, rank, world, dataset, kwargs, line
):
    checkpoints = str(tmp_path / "checkpoints")
    dataset = {k: v.replace("CHECKPOINTS", checkpoints) if isinstance(v, str) else v for k, v in dataset.items()}
    made = StreamingDataset(optimized, **{"cache_dir": str(tmp_path / "cache"), **dataset})
    with pytest.raises(UserError) as raised:
        streaming.check(StreamingDataLoader(made, batch_size=4, **kwargs), rank, world, checkpoints)
    assert str(raised.value).startswith(line.replace("CHECKPOINTS", checkpoints)), str(raised.value)


def test_drop_last_off_on_several_processes_is_one_line(optimized, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # litdata reads it when the dataset is made
    made = loader(optimized, tmp_path, dataset={"drop_last": False})
    with pytest.raises(UserError, match=r"^StreamingDataset\(drop_last=False\) on 2 processes cannot resume exactly"):
        streaming.check(made, 0, 2, None)


def test_a_weighted_combination_is_one_line(optimized, tmp_path):
    parts = [StreamingDataset(optimized, cache_dir=str(tmp_path / c)) for c in "ab"]
    weighted = StreamingDataLoader(CombinedStreamingDataset(parts, weights=[0.5, 0.5], iterate_over_all=False))
    with pytest.raises(UserError, match="^a CombinedStreamingDataset with weights cannot resume exactly"):
        streaming.check(weighted, 0, 1, None)


def test_the_state_names_this_hosts_cache():
    """A state saved on another host (its cache path) is given to this host's dataset with none: litdata derives
    the path from the URL under this dataset's cache, as it derives its own; a state of other data is left alone."""

    class Dataset:
        input_dir = type("Dir", (), {"url": "s3://b/ids", "path": None})()
        cache_dir = type("Dir", (), {"path": "/opt/ml/streaming-cache"})()

    saved = {"dataset": {"input_dir_url": "s3://b/ids", "input_dir_path": "/host0/cache/1/2", "cache_dir_path": None}}
    state = streaming.localized({**saved, "num_samples_yielded": 8}, Dataset())
    assert state["dataset"] == {"input_dir_url": "s3://b/ids", "input_dir_path": None,
                                "cache_dir_path": "/opt/ml/streaming-cache"}  # fmt: skip
    assert state["num_samples_yielded"] == 8 and saved["dataset"]["input_dir_path"] == "/host0/cache/1/2"
    other = {"dataset": {"input_dir_url": "s3://b/other", "input_dir_path": "/x"}}
    assert streaming.localized(other, Dataset()) is other


def test_the_plan_gives_litdata_the_node_count_and_the_jobs_cache():
    env = {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2", "SAGEMAKER_BASE_DIR": "/opt/ml"}
    assert {k: make_plan(env, {"eth0"}).env[k] for k in ("NNODES", "LITDATA_CACHE_DIR")} == {
        "NNODES": "2",
        "LITDATA_CACHE_DIR": "/opt/ml/streaming-cache",
    }
    assert make_plan({**env, "LITDATA_CACHE_DIR": "/nvme/chunks"}, {"eth0"}).env["LITDATA_CACHE_DIR"] == "/nvme/chunks"
    assert "NNODES" not in make_plan({}, set()).env  # outside a job: nothing
    torchrun = {"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1", "MASTER_ADDR": "pt-master-0", "MASTER_PORT": "23456"}  # fmt: skip
    elsewhere = make_plan(torchrun, {"eth0"}).env  # another platform's job: the nodes, and litdata's own cache
    assert elsewhere["NNODES"] == "2" and "LITDATA_CACHE_DIR" not in elsewhere


def test_a_plain_http_endpoint_is_allowed_only_where_it_is_http(monkeypatch):
    from litdata.streaming import downloader

    options = {k: v for k, v in downloader._OBSTORE_CLIENT_OPTIONS.items() if k != "allow_http"}  # as litdata has it
    monkeypatch.setattr(downloader, "_OBSTORE_CLIENT_OPTIONS", options)
    for key in streaming.ENDPOINT_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    streaming.allow_plain_http({"endpoint_url": "https://s3.example.com"})
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://s3.us-east-1.amazonaws.com")
    streaming.allow_plain_http(None)
    assert "allow_http" not in downloader._OBSTORE_CLIENT_OPTIONS
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000")
    streaming.allow_plain_http(None)
    assert downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] is True
    assert os.environ["AWS_ENDPOINT_URL"].startswith("https")


def test_a_bucket_the_job_cannot_read_is_one_line(monkeypatch):
    """S3 answers AccessDenied (the job's role lacks s3:ListBucket): the line names the bucket and the permissions."""
    import boto3
    from botocore.stub import Stubber

    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b")
    stubber = Stubber(client)
    stubber.add_client_error("list_objects_v2", "AccessDenied", "Access Denied", 403)
    stubber.activate()
    monkeypatch.setattr(boto3, "client", lambda *args, **kwargs: client)
    with pytest.raises(UserError) as raised:
        streaming.check_source("s3://private/ids")
    assert str(raised.value) == (
        "the job cannot read s3://private/ids (ListObjectsV2: AccessDenied); give the job's role s3:ListBucket and "
        "s3:GetObject on bucket private"
    )


def test_a_directory_without_an_optimized_dataset_is_one_line(tmp_path, optimized):
    streaming.check_source(optimized)
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"x")
    with pytest.raises(UserError, match=r"is not a dataset litdata optimized: it has no index.json \(holds cifar-10"):
        streaming.check_source(str(tmp_path))


def test_a_step_pays_for_the_seeding_hook_only_where_data_streams(optimized, tmp_path):
    """Steps skips a step_start that is None: a job whose training data does not stream calls nothing more per step."""
    from types import SimpleNamespace

    def trainer(*loaders):
        combined = SimpleNamespace(flattened=list(loaders))
        return SimpleNamespace(fit_loop=SimpleNamespace(_combined_loader=combined), current_epoch=3)

    callback = streaming.StreamingEpochs(None)
    callback.on_train_epoch_start(trainer(object()), None)
    assert callback.step_start is None
    streamed = loader(optimized, tmp_path, dataset={"seed": 5})
    callback.on_train_epoch_start(trainer(streamed), None)
    assert callable(callback.step_start) and callback._seed == 5
    assert streamed.current_epoch == 3  # the trainer's: the loader adds 1 when the epoch's first batch is asked for


def test_a_resume_with_another_batch_size_says_what_litdata_trains_again(optimized, tmp_path, capsys):
    """litdata's elastic resume rounds the sample reached down to a batch of the new shape, silently (issue 48, item
    4): the runtime says so in one line, and keeps the batches it counts as done for Lightning's count."""
    first = loader(optimized, tmp_path)
    batches = iter(first)
    seen = [int(i) for _ in range(3) for i in next(batches)["id"]]  # 3 batches of 4: 12 samples
    state = first.state_dict()
    again = StreamingDataLoader(StreamingDataset(optimized, cache_dir=str(tmp_path / "again")), batch_size=8)
    streaming.prepared(again)
    again.load_state_dict(state)
    assert capsys.readouterr().out.splitlines() == [
        "resumed epoch 0 with batch size 8 (was 4): the epoch restarts at sample 8 (4 samples trained again)"
    ]
    assert again.resumed == (0, 1)
    rest = [int(i) for batch in again for i in batch["id"]]
    assert sorted(set(seen + rest)) == list(range(40)) and len(seen + rest) == 44
