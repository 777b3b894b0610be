"""Every private attribute of another library that the runtime (app/sagemaker_lightning/) or the launcher
(scripts/jobs/) reads, writes, calls or imports still exists in the installed versions: an upgrade that removes one
fails here, naming it and the module that needs it, not in a user's job. ROWS is docs/architecture.md's "Private
attributes of other libraries" row for row (the docs say why no public API serves each); a row in one and not the
other fails, and so does a row whose module no longer names its attribute.

An attribute exists when the owner (a module or a class) has it, when its module imports, or, for an instance
attribute, when the class (or a base) names it as `self.<name>` or "<name>" in its source. Lightning's rows hold in
lightning.pytorch and in pytorch_lightning alike (the image carries both). The launcher's row is read from SDK 3.x's
source in .venv-sdk3 when this environment has SDK 2.x.

    .venv/bin/pytest tests/unit/test_private_attributes.py
"""

import functools
import glob
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re

import pytest

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNTIME = os.path.join(ROOT, "app", "sagemaker_lightning")
ARCHITECTURE = os.path.join(ROOT, "docs", "architecture.md")
SECTION = "## Private attributes of other libraries"
LIGHTNING = ("lightning.pytorch", "pytorch_lightning")  # what `pl.` stands for, each package in turn
SDK3 = os.path.join(ROOT, ".venv-sdk3", "lib", "python3*", "site-packages")
SPELLED = {"_is_amx_tile_supported": "amx_tile", "_is_avx512_bf16_supported": "avx512_bf16"}  # built as f"_is_{x}_..."

TC = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"
MPS = "pl.strategies.ModelParallelStrategy"
MLF = "pl.loggers.MLFlowLogger"
# (owner, attribute: a dotted path from it, "a or b" where the runtime takes whichever this version has, the modules
# that touch it: the runtime's from app/sagemaker_lightning/, the launcher's from the repository's root)
ROWS = (
    ("pl.Trainer", "_signal_connector", "stop/agreement.py"),
    ("pl.trainer.connectors.signal_connector._SignalConnector", "_sigterm_notifier_fn", "stop/agreement.py"),
    ("pl.loops.training_epoch_loop._TrainingEpochLoop", "_broadcast_sigterm_tensor", "stop/agreement.py"),
    ("pl.Trainer", "_evaluation_loop", "stop/agreement.py"),
    ("pl.loops.training_epoch_loop._TrainingEpochLoop", "_should_check_val_fx", "checkpoints/validation.py"),
    ("pl.loops.fit_loop._FitLoop", "_data_fetcher", "checkpoints/validation.py"),
    ("pl.loops.fit_loop._FitLoop", "_combined_loader", "data/streaming.py, data/training_loader.py"),
    ("pl.loops.fit_loop._FitLoop", "_load_combined_loader_states", "data/streaming.py"),
    ("pl.callbacks.ModelCheckpoint", "_legacy_state_key", "checkpoints/confine.py"),
    ("pl.cli.LightningCLI", "_parser", "cli/hub.py"),
    ("pl.cli.LightningCLI", "_instantiate_trainer", "cli/hub.py"),
    (MPS, "_data_parallel_size", "parallel/fsdp.py"),
    (MPS, "_tensor_parallel_size", "parallel/fsdp.py"),
    (MPS, "_save_distributed_checkpoint", "parallel/fsdp.py"),
    ("pl.strategies.model_parallel", "_materialize_distributed_module", "parallel/fsdp.py"),
    ("pl.strategies.model_parallel", "_optimizers_to_device", "parallel/fsdp.py"),
    ("pl.strategies.DDPStrategy", "_timeout", "parallel/strategy.py"),
    ("pl.strategies.DDPStrategy", "_start_method", "cli/precision.py"),
    ("pl.core.optimizer.LightningOptimizer", "_optimizer", "parallel/fsdp.py"),
    ("pl.LightningModule", "_compiler_ctx", "checkpoints/compile_cache.py"),
    (MLF, "_tracking_uri", "tracking/tracker.py"),
    (MLF, "_experiment_name", "tracking/tracker.py"),
    (MLF, "_run_id", "tracking/tracker.py"),
    (MLF, "_experiment_id", "tracking/tracker.py"),
    (MLF, "_initialized", "tracking/tracker.py"),
    (MLF, "_mlflow_client", "tracking/tracker.py"),
    (MLF, "_prefix", "tracking/tracker.py"),
    (MLF, "_log_model", "tracking/tracker.py"),
    ("torch.distributed.distributed_c10d", "_get_default_store", "stop/agreement.py"),
    ("torch._C._distributed_c10d", "_dump_fr_trace", "health/judge.py"),
    ("torch._C._distributed_c10d", "_dump_fr_trace_json or _dump_nccl_trace_json", "health/heartbeats.py"),
    ("torch.distributed.checkpoint._traverse", "set_element", "checkpoints/sharded_saves.py"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING", "checkpoints/sharded_saves.py"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo", "checkpoints/sharded_saves.py"),
    ("torch.serialization", "_get_layout", "checkpoints/sharded_saves.py"),
    (TC, "CheckpointWrapper", "parallel/fsdp_sharding.py"),
    (TC, "apply_activation_checkpointing", "parallel/fsdp_sharding.py"),
    (f"{TC}.CheckpointWrapper", "_checkpoint_wrapped_module", "parallel/fsdp_sharding.py"),
    ("torch.distributed", "_composable.fsdp or fsdp", "parallel/fsdp.py, parallel/fsdp_sharding.py"),
    ("torch.nn.Module", "_buffers", "parallel/fsdp_sharding.py"),
    ("torch.nn.Module", "_compiled_call_impl", "checkpoints/compile_cache.py"),
    ("torch._dynamo.eval_frame", "OptimizedModule", "checkpoints/compile_cache.py"),
    ("torch.compiler", "_cache", "checkpoints/compile_cache.py"),
    ("torch.utils.data.DataLoader", "_index_sampler", "data/resumable.py"),
    ("torch.cpu", "_is_amx_tile_supported", "cli/precision.py"),
    ("torch.cpu", "_is_avx512_bf16_supported", "cli/precision.py"),
    ("torchvision.models.mnasnet", "_InvertedResidual", "parallel/fsdp_sharding.py"),
    ("torchvision.models.densenet", "_DenseLayer", "parallel/fsdp_sharding.py"),
    ("litdata.CombinedStreamingDataset", "_datasets", "data/streaming.py"),
    ("litdata.CombinedStreamingDataset", "_iterate_over_all", "data/streaming.py"),
    ("litdata.StreamingDataset", "_force_override_state_dict", "data/streaming.py"),
    ("litdata.StreamingDataset", "_create_shuffler", "data/streaming.py"),
    ("litdata.streaming.shuffle.FullShuffle", "_global_assign", "data/streaming.py"),
    ("litdata.streaming.shuffle.FullShuffle", "_chunk_byte_sizes", "data/streaming.py"),
    ("litdata.streaming.shuffle.FullShuffle", "_max_cache_size", "data/streaming.py"),
    ("litdata.streaming.cache.Cache", "_reader", "data/streaming.py, data/decoders.py"),
    ("litdata.streaming.reader.BinaryReader", "_config", "data/streaming.py, data/decoders.py"),
    ("litdata.streaming.reader.BinaryReader", "_max_cache_size", "data/streaming.py"),
    ("litdata.streaming.config.ChunksConfig", "_chunks", "data/streaming.py"),
    ("litdata.streaming.config.ChunksConfig", "_config", "data/decoders.py"),
    ("litdata.streaming.downloader", "_OBSTORE_CLIENT_OPTIONS", "data/streaming.py"),
    ("litdata.utilities.env", "_DistributedEnv", "data/streaming.py"),
    ("litdata.utilities._pytree", "tree_unflatten", "data/decoders.py"),
    ("litdata.utilities._pytree", "treespec_loads", "data/decoders.py"),
    ("litdata.streaming.serializers", "_SERIALIZERS", "data/decoders.py"),
    ("litdata.streaming.serializers", "_get_serializers", "data/decoders.py"),
    ("mlflow.entities.RunData", "_metric_objs", "tracking/mlflow_run.py"),
    ("jsonargparse.ArgumentParser", "_subcommands_action", "cli/subcommands.py"),
    ("sagemaker_pytorch_container.training", "_set_torch_version_environment", "boot/toolkit.py"),
    ("sagemaker.train.model_trainer.ModelTrainer", "_latest_training_job", "scripts/jobs/sdk3.py"),
)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def resolve(path: str):
    """The module, class or object at the dotted `path`, importing modules on the way; AttributeError if none."""
    parts = path.split(".")
    found = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 2):
        if hasattr(found, part):
            found = getattr(found, part)
            continue
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            raise AttributeError(f"{'.'.join(parts[: i - 1])} has no {part}") from None
    return found


@functools.cache
def source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # a class of C, or of a module without its source
        return ""


def named_in(text: str, name: str) -> bool:
    """Whether `text` names `name` as an instance attribute: `self.<name>`, or "<name>" (super().__setattr__)."""
    return re.search(rf"\bself\.{name}\b|[\"']{name}[\"']", text) is not None


def has(owner: str, attribute: str) -> bool:
    """Whether the module or class at `owner` has the dotted `attribute`: its own, a submodule, or an instance
    attribute its class's source names."""
    *path, name = attribute.split(".")
    try:
        found = resolve(".".join([owner, *path]))
    except AttributeError:
        return False
    if hasattr(found, name):
        return True
    if inspect.ismodule(found):  # a submodule not yet imported
        return hasattr(found, "__path__") and importlib.util.find_spec(f"{found.__name__}.{name}") is not None
    return inspect.isclass(found) and any(named_in(source(c), name) for c in found.__mro__ if c is not object)


def sdk_major() -> str | None:
    try:
        return importlib.metadata.version("sagemaker").split(".")[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def sdk3_source(owner: str) -> str | None:
    """The source of SDK 3.x's module of `owner` (module.Class) in .venv-sdk3; None without it."""
    module = owner.rpartition(".")[0]
    for site in glob.glob(SDK3):
        path = os.path.join(site, *module.split(".")) + ".py"
        if os.path.isfile(path):
            return read(path)
    return None


def owners(owner: str) -> list[str]:
    """`owner` as each Lightning package names it (`pl.`), or as it is."""
    return [owner.replace("pl.", f"{pl}.", 1) for pl in LIGHTNING] if owner.startswith("pl.") else [owner]


def row_id(row: tuple) -> str:
    return f"{row[0].rpartition('.')[2]}.{row[1].split(' or ')[0]}"


@pytest.mark.parametrize("row", ROWS, ids=row_id)
def test_the_private_attribute_still_exists(row):
    owner, attribute, modules = row
    alternatives = attribute.split(" or ")
    for path in owners(owner):
        where = f"{path}.{attribute}, which {modules} needs (docs/architecture.md: {SECTION[3:]!r})"
        if path.startswith("sagemaker.") and sdk_major() != "3":
            if (text := sdk3_source(path)) is None:  # SDK 2.x here (its import alone takes seconds)
                pytest.skip("SDK 3.x is in .venv-sdk3, which this checkout lacks (make install)")
            assert any(named_in(text, name) for name in alternatives), f"SDK 3.x in .venv-sdk3 lacks {where}"
            continue
        try:
            resolve(path)
        except AttributeError as e:
            pytest.fail(f"{where}: its owner is gone ({e})")
        version = getattr(importlib.import_module(path.split(".")[0]), "__version__", "?")
        assert any(has(path, name) for name in alternatives), f"{path.split('.')[0]} {version} lacks {where}"


@pytest.mark.parametrize("row", ROWS, ids=row_id)
def test_the_module_that_needs_it_names_it(row):
    """A row outlives no use: each module it names still spells the attribute, each alternative of it (a stale row
    fails here)."""
    _, attribute, modules = row
    for module in modules.split(", "):
        text = read(os.path.join(ROOT, module) if module.startswith("scripts/") else os.path.join(RUNTIME, module))
        missing = [name for name in attribute.split(" or ") if SPELLED.get(name, name) not in text]
        assert not missing, f"{module} no longer names {', '.join(missing)}: its row goes, or names another module"


def documented() -> set[tuple[str, str, str]]:
    """(owner, attribute, modules) of each row of the docs' table, as ROWS writes them."""
    section = read(ARCHITECTURE).split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = set()
    for line in section.splitlines():
        if found := re.match(r"\|\s*`([\w.]+)`\s*\|([^|]+)\|([^|]+)\|", line):
            attribute = " or ".join(re.findall(r"`([\w.]+)`", found[2]))
            rows.add((found[1], attribute, ", ".join(re.findall(r"`([\w/.]+\.py)`", found[3]))))
    return rows


def test_the_docs_table_is_this_table():
    docs, here = documented(), set(ROWS)
    assert len(here) == len(ROWS), "a row twice in ROWS"
    assert not docs - here, f"rows of docs/architecture.md that ROWS lacks: {sorted(docs - here)}"
    assert not here - docs, f"rows of ROWS that docs/architecture.md lacks: {sorted(here - docs)}"
