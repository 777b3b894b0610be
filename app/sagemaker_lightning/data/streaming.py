"""Data streamed from S3 with litdata: a restarted job resumes at the exact sample on every rank and node.

A project streams a dataset that litdata's optimize() wrote (index.json and chunk files under an s3:// prefix, or in
a channel) through litdata's StreamingDataset and StreamingDataLoader. The loader's position (samples yielded, epoch)
is its state_dict, which Lightning saves in every checkpoint (last.ckpt every N steps, at each epoch's end, on a stop:
checkpoints/last.py) and gives back on resume. The launch plan gives litdata the node count (NNODES) and, on
SageMaker, this host's cache directory (LITDATA_CACHE_DIR: paths.streaming_cache_dir). With litdata 0.2.76 and
Lightning 2.6.6 that alone does not resume exactly; in a job (SageMaker's or another platform's: plan.in_job) the
runtime gets around each defect found (docs/streaming.md, with the tests):

  - the state names this host's cache path, and litdata refuses a state with another (another host's, a moved
    cache): the loader is given the state with its own paths (`localized`);
  - on several nodes, from the second epoch on litdata keeps each node on the chunks it read in the first, which
    repeats and drops the samples of a chunk split between two nodes: every epoch is shuffled over the whole
    dataset, as on one node (`GlobalShuffle`);
  - Lightning ends an epoch at the loader's length, before litdata clears a restored position: the epoch after a
    mid-epoch resume restored it again and had no batches; and a loader made anew counts its epochs from 1 while the
    trainer is at a later one. At each epoch's start the loader's epoch is the trainer's, at its end nothing is
    left to restore (`StreamingEpochs`);
  - Lightning drops every loader's state when configure_optimizers asks for trainer.estimated_stepping_batches before
    the restore (Lightning issue 20550): the states it skipped are loaded when training starts, for any loader;
  - a plain-http S3 endpoint (S3-compatible stores, moto) fails every chunk download ("builder error": litdata's
    obstore client lacks allow_http): it is allowed where the endpoint is http.

A dataset with a setting that cannot resume exactly is refused in one line before the first step (`check`), and so is
one whose fields litdata would decode with a decoder that can run code (decoders.py).

    python -c "from sagemaker_lightning.data import streaming; help(streaming.check)"
"""

import functools
import os
import sys

from sagemaker_lightning.data import decoders, draws
from sagemaker_lightning.data.resumable import continued
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.location import inside

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # botocore's order: the S3 one wins
INDEX = "index.json"  # what litdata's optimize() writes beside the chunks: a dataset's table of contents


def is_streaming(loader) -> bool:
    """Whether `loader` is litdata's StreamingDataLoader (litdata is imported only by a project that uses it)."""
    module = sys.modules.get("litdata.streaming.dataloader")
    return module is not None and isinstance(loader, module.StreamingDataLoader)


def datasets(loader) -> list:
    """The StreamingDatasets a streaming loader reads: its dataset, or those a combined one holds."""
    return list(getattr(loader.dataset, "_datasets", None) or [loader.dataset])


def training_loaders(trainer) -> list:
    combined = trainer.fit_loop._combined_loader
    return [loader for loader in (combined.flattened if combined is not None else []) if is_streaming(loader)]


def check(loader, rank: int, world_size: int, checkpoint_dir: str | None) -> None:
    """One line for a streaming loader that cannot resume exactly, or whose cache cannot work."""
    if getattr(loader.dataset, "_iterate_over_all", True) is False:
        raise UserError(
            "a CombinedStreamingDataset with weights cannot resume exactly (litdata restores no position in it); "
            "iterate over all its datasets (no weights) or give each its own loader"
        )
    for dataset in datasets(loader):
        made_for = (dataset.distributed_env.world_size, dataset.distributed_env.global_rank)
        if made_for != (world_size, rank):
            raise UserError(
                f"a StreamingDataset was made for rank {made_for[1]} of {made_for[0]} processes, but this is rank "
                f"{rank} of {world_size}: make it in the data module's setup() or train_dataloader(), once the "
                "processes have joined, not in __init__"
            )
        if dataset._force_override_state_dict:
            raise UserError(
                "StreamingDataset(force_override_state_dict=True) cannot resume exactly: a checkpoint written with "
                "other settings would repeat or skip samples; remove it"
            )
        if world_size > 1 and not dataset.drop_last:
            raise UserError(
                f"StreamingDataset(drop_last=False) on {world_size} processes cannot resume exactly: the ranks would "
                "take different numbers of steps; leave drop_last unset"
            )
        cache = dataset.cache_dir.path or os.environ.get("LITDATA_CACHE_DIR")
        if cache and checkpoint_dir and inside(os.path.abspath(cache), checkpoint_dir):
            raise UserError(
                f"the streaming cache {cache} is inside the checkpoint directory {checkpoint_dir}, which SageMaker "
                "uploads; leave StreamingDataset's cache_dir unset (the job's own cache) or name another folder"
            )
        _check_cache_size(dataset, loader)
        decoders.check_dataset(dataset, loader)


def _check_cache_size(dataset, loader) -> None:
    """A cache smaller than one chunk can hold nothing it downloads (a local dataset is read in place: no cache)."""
    if dataset.input_dir.url is None:
        return
    if dataset.shuffler is None:
        dataset.get_len(loader.num_workers, loader.batch_size)  # reads index.json, as Lightning's len() would
    reader = dataset.shuffler.cache._reader
    limit, chunks = reader._max_cache_size, (reader._config and reader._config._chunks) or []
    largest = max((int(chunk["chunk_bytes"]) for chunk in chunks), default=0)
    if limit and largest > limit:
        raise UserError(
            f"the streaming cache may hold {limit} bytes, less than one chunk of {dataset.input_dir.url or ''} "
            f"({largest} bytes); raise max_cache_size (or MAX_CACHE_SIZE), or optimize the dataset into smaller "
            "chunks (chunk_bytes)"
        )


def check_source(url: str, storage_options: dict | None = None) -> None:
    """One line when `url` is not a dataset litdata optimized that this job can read: an s3:// prefix (its bucket
    listed, its index.json there) or a directory (a channel) with index.json; or when its index.json names a decoder
    that can run code (decoders.check_index). litdata itself fails on a missing index with a bare 404 (HeadObject),
    whatever the cause. An s3:// prefix at a plain-http endpoint is read over http (allow_plain_http): a dataset made
    before the loader, as litdata asks (in setup()), reads its index then."""

    def not_optimized(held: list[str] | None) -> UserError:  # held: what the folder or prefix holds, None: no folder
        what = "does not exist" if held is None else f"holds {', '.join(held[:3])}" if held else "is empty"
        return UserError(
            f"{url} is not a dataset litdata optimized: it has no {INDEX} ({what}); write one with "
            "scripts/upload_data.py --format litdata (or litdata.optimize)"
        )

    if not url.startswith("s3://"):
        if not os.path.isfile(os.path.join(url, INDEX)):
            raise not_optimized(sorted(os.listdir(url)) if os.path.isdir(url) else None)
        return decoders.check_index(decoders.read_index(url), url)
    allow_plain_http(storage_options)
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, prefix = url[len("s3://") :].partition("/")
    prefix = prefix.strip("/")
    endpoint = (storage_options or {}).get("endpoint_url")
    s3 = boto3.client("s3", **({"endpoint_url": endpoint} if endpoint else {}))
    try:
        held = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=4).get("Contents", [])]
        index = s3.get_object(Bucket=bucket, Key=f"{prefix}/{INDEX}" if prefix else INDEX)["Body"].read()
    except ClientError as e:
        code, operation = e.response.get("Error", {}).get("Code", "?"), e.operation_name
        if code in ("404", "NoSuchKey") and operation == "GetObject":
            raise not_optimized(held) from None
        if code == "NoSuchBucket":
            raise UserError(f"bucket {bucket} of {url} does not exist; check the data URI") from None
        raise UserError(
            f"the job cannot read {url} ({operation}: {code}); give the job's role s3:ListBucket and s3:GetObject on "
            f"bucket {bucket}"
        ) from None
    except BotoCoreError as e:
        raise UserError(f"cannot reach S3 for {url} ({e}); check the job's network (VPC endpoint) and region") from None
    decoders.check_index(decoders.parsed(index), url)


def localized(state: dict, dataset) -> dict:
    """The loader state `state`, its cache paths this dataset's: the same remote data, cached on this host (litdata
    compares the path to the one the state names, and a resumed rank on another host, or a moved cache, differs)."""
    saved = state.get("dataset") or {}
    if not saved.get("input_dir_url") or saved["input_dir_url"] != dataset.input_dir.url:
        return state
    # no path: litdata derives it from the URL under cache_dir_path, as it derives this dataset's own
    return {**state, "dataset": {**saved, "input_dir_path": None, "cache_dir_path": dataset.cache_dir.path}}


def _load_localized(loader, load, state: dict) -> None:
    load(localized(state, loader.dataset) if not hasattr(loader.dataset, "_datasets") else state)
    reshaped(loader, state)


def reshaped(loader, state: dict) -> None:
    """A state saved with another batch or world size (or worker count): litdata resumes at the global batch of the
    new shape that holds the sample reached (elastic resume, rounded down), silently; said here in one line (global
    rank 0), and the batches it counts as done kept for Lightning's count (`resumed`, training_loader.py)."""
    from litdata.streaming.elastic import sample_in_epoch_from_state, topology_changed
    from litdata.utilities.env import _DistributedEnv

    saved, env = state.get("dataset"), _DistributedEnv.detect()
    now = {"batch size": int(loader.batch_size or 1), "world size": env.world_size, "workers": loader.num_workers or 1}
    if (
        not isinstance(saved, dict)
        or "batch_size" not in saved
        or not topology_changed(
            saved, world_size=now["world size"], num_workers=now["workers"], batch_size=now["batch size"]
        )
    ):
        return
    workers = max(1, int(saved["num_workers"] or 1))  # litdata counts 0 workers as 1, as `now` does
    was = {"batch size": saved["batch_size"], "world size": saved.get("world_size"), "workers": workers}
    epoch = state["current_epoch"] - 1  # litdata counts from 1, Lightning from 0
    at, line = continued(epoch, was, now, sample_in_epoch_from_state(saved), ordered=())
    loader.resumed = (epoch, at // (now["batch size"] * now["world size"]))
    if env.global_rank == 0:
        say(line)


@functools.cache
def _global_shuffle():
    from litdata.streaming.shuffle import FullShuffle
    from litdata.utilities.shuffle import node_shard_fits_in_cache

    class GlobalShuffle(FullShuffle):
        """FullShuffle whose every epoch is one permutation of all chunks, on any number of nodes, as epoch 1 is
        (litdata's own later epochs keep each node on its first epoch's chunks, repeating and dropping samples)."""

        @functools.lru_cache(maxsize=10)  # noqa: B019 (FullShuffle's own: its length is asked for at every len())
        def get_chunks_and_intervals_per_workers(self, distributed_env, num_workers, batch_size, current_epoch):
            intervals = self.cache.get_chunk_intervals()
            self.node_shard_fits = node_shard_fits_in_cache(sum(self._chunk_byte_sizes()), self._max_cache_size())
            return self._global_assign(distributed_env, intervals, num_workers, batch_size, current_epoch)

    return GlobalShuffle


def allow_plain_http(storage_options: dict | None) -> None:
    """litdata's obstore client (chunk downloads) allows http when the S3 endpoint is http."""
    endpoint = (storage_options or {}).get("endpoint_url") or next(
        (os.environ[k] for k in ENDPOINT_VARIABLES if os.environ.get(k)), ""
    )
    if endpoint.startswith("http://"):
        from litdata.streaming import downloader

        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True


def _shuffler(dataset, cache):
    """The dataset's shuffler, made in every process that iterates it (a DataLoader worker too)."""
    allow_plain_http(dataset.storage_options)
    shuffler = type(dataset)._create_shuffler(dataset, cache)
    # the index this reader decodes with: litdata reads it anew for each reader (each worker, each epoch)
    decoders.check_cache(cache, dataset.input_dir.url or dataset.input_dir.path, dataset.serializers)
    if type(shuffler).__name__ == "FullShuffle":
        shuffler.__class__ = _global_shuffle()
    return shuffler


def prepared(loader):
    """`loader` with the runtime's ways around litdata's defects (module docstring); once."""
    if getattr(loader, "_sagemaker_lightning", False):
        return loader
    for dataset in datasets(loader):
        dataset._create_shuffler = functools.partial(_shuffler, dataset)
        allow_plain_http(dataset.storage_options)
    loader.load_state_dict = functools.partial(_load_localized, loader, loader.load_state_dict)
    loader._sagemaker_lightning = True
    return loader


class StreamingEpochs:
    """The runtime's side of a streamed training loader (module docstring), from the start of training to each epoch's
    end; the loader itself comes prepared (training_loader.py)."""

    BASE = "callbacks.Callback"

    def __init__(self, checkpoint_dir: str | None):
        self.checkpoint_dir = checkpoint_dir
        self._seed = None  # the streamed dataset's seed, in an epoch that streams

    def on_train_start(self, trainer, pl_module):
        for loader in training_loaders(trainer):
            check(loader, trainer.global_rank, trainer.world_size, self.checkpoint_dir)
        trainer.fit_loop._load_combined_loader_states()  # those Lightning skipped (issue 20550); else none is left
        self.on_train_epoch_start(trainer, pl_module)  # Lightning calls it for no epoch resumed mid-way

    def on_train_epoch_start(self, trainer, pl_module):
        self._seed = None
        for loader in training_loaders(trainer):
            self._seed = datasets(loader)[0].seed
            if loader.restore and loader.current_epoch != trainer.current_epoch + 1:
                loader.restore = False  # a position in another epoch (one Lightning counts as done)
            if not loader.restore:  # the loader adds 1 when the epoch's first batch is asked for
                loader.current_epoch = trainer.current_epoch
        if self._seed is None:  # a step pays for step_start only where data streams (concern.py's Steps skips None)
            self.step_start = None
        else:
            vars(self).pop("step_start", None)

    def step_start(self, trainer, batch_idx):
        """What the step draws (dropout) is the same in a resumed run as in the uninterrupted one, as ResumableEpoch
        makes it for the runtime's own loaders (there with the states saved): the generators seeded from the
        dataset's seed, the epoch, the batch."""
        draws.seed_all(hash((self._seed, trainer.current_epoch, batch_idx)))

    def on_train_epoch_end(self, trainer, pl_module):
        for loader in training_loaders(trainer):
            loader.restore = False
