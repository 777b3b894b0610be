"""Train the image classifier with LightningCLI: the same command line on a laptop, in Docker and on SageMaker.

Defaults come from trainer.yaml; every one can be overridden (`--key value`, as SageMaker passes hyperparameters).

    python scripts/make_dataset.py synthetic data/synthetic
    python app/train.py --data.data_dir data/synthetic --trainer.max_epochs 1 --trainer.accelerator cpu --model_dir out
"""

import os
import re
import signal
import socket
import sys
import tempfile
import traceback
import warnings
from datetime import timedelta

import pytorch_lightning as pl
import torch
from jsonargparse import ArgumentError
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.cli import LightningArgumentParser, LightningCLI
from pytorch_lightning.loggers import TensorBoardLogger
from pytorch_lightning.plugins.environments import LightningEnvironment, TorchElasticEnvironment
from pytorch_lightning.strategies import DDPStrategy
from pytorch_lightning.utilities.exceptions import MisconfigurationException, SIGTERMException

import sagemaker_env
from callbacks import LinearLRScaling, LogLines, RankReport
from checkpoints import AtomicCheckpointIO, LastCheckpoint
from data import CIFAR10Base
from device_data import DeviceCIFAR10DataModule  # noqa: F401 (imported, so that --data finds it by its short name)
from failure import UserError, report
from model import ImageClassifier

TRAINER_YAML = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trainer.yaml")
# args= carries sys.argv plus SageMaker's settings; sys.argv itself must stay as it is, since Lightning's DDP
# launcher starts the other local ranks with it
warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")


class CLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_class_arguments(TensorBoardLogger, "logger")
        parser.add_argument(
            "--model_dir", type=str | None, default=None, help="where rank 0 writes model.pt and config.yaml"
        )
        parser.add_argument(
            "--last_checkpoint_every_n_steps", type=int, default=0, help="last.ckpt every N steps (0: epochs only)"
        )
        parser.add_argument("--dist_timeout", type=int, default=600, help="seconds a rank waits for the others")
        parser.add_argument(
            "--scale_lr_by_world_size", type=bool, default=False, help="optimizer lr × number of processes"
        )
        parser.link_arguments("data.init_args.num_classes", "model.num_classes")

    def instantiate_trainer(self, **kwargs) -> pl.Trainer:
        config = self.config_init
        callbacks = [LastCheckpoint(config["last_checkpoint_every_n_steps"]), LogLines()]
        if config["scale_lr_by_world_size"]:
            callbacks.append(LinearLRScaling())
        kwargs["callbacks"] = [*(config["trainer"].get("callbacks") or []), *callbacks]
        kwargs["plugins"] = [*(config["trainer"].get("plugins") or []), AtomicCheckpointIO()]
        kwargs.update(strategy(os.environ, config["trainer"], config["dist_timeout"], kwargs["plugins"]))
        if config["trainer"].get("enable_progress_bar") is None:  # carriage returns make a mess of log files
            kwargs["enable_progress_bar"] = sys.stdout.isatty()
        trainer = super().instantiate_trainer(logger=config["logger"], **kwargs)
        sagemaker_env.check_world_size(os.environ, trainer.num_nodes, trainer.num_devices)
        return trainer


def strategy(env, trainer_config: dict, timeout_s: int, plugins: list) -> dict:
    """Trainer arguments for distributed training. DDP with a timeout on joining and on every collective (never
    torch's 30 minutes). On SageMaker: the cluster environment that knows the launcher's ranks (not Lightning's
    guess: with mpi4py installed it would try MPI in a process mpirun did not start), and SMDDP's process-group
    backend when the job asks for it (else Lightning's choice: NCCL on GPUs, gloo on CPUs)."""
    cluster, backend = None, None
    if sagemaker_env.in_sagemaker(env):
        cluster = TorchElasticEnvironment() if sagemaker_env.launcher(env) == "torchrun" else LightningEnvironment()
        if sagemaker_env.smddp_enabled(env):
            try:
                import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401  registers the "smddp" backend
            except ImportError as e:
                raise UserError(
                    "the job enables SMDDP (smdistributed dataparallel) but this image has no "
                    "smdistributed.dataparallel; build FLAVOR=dlc-smddp or conda, or use pytorchddp"
                ) from e
            backend = "smddp"
    chosen = trainer_config.get("strategy")
    if chosen == "ddp":
        ddp = DDPStrategy(
            cluster_environment=cluster, process_group_backend=backend, timeout=timedelta(seconds=timeout_s)
        )
        return {"strategy": ddp}
    if backend:
        raise UserError(f"SMDDP needs trainer.strategy=ddp, not {chosen!r}")
    return {"plugins": [*plugins, cluster]} if cluster else {}


def export(trainer: pl.Trainer, model: ImageClassifier, config_yaml: str, model_dir: str) -> None:
    """Rank 0 writes the best weights and the resolved config; in local mode all hosts share one model dir."""
    if not trainer.is_global_zero:
        return
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"] if best else model.state_dict()
    os.makedirs(model_dir, exist_ok=True)
    writers = {"config.yaml": lambda f: f.write(config_yaml.encode()), "model.pt": lambda f: torch.save(state, f)}
    for name, write in writers.items():
        with open(os.path.join(model_dir, f".{name}.partial"), "wb") as f:
            write(f)
    for name in writers:  # model.pt last: its presence means the export is complete
        os.replace(os.path.join(model_dir, f".{name}.partial"), os.path.join(model_dir, name))
    print(f"model: {os.path.join(model_dir, 'model.pt')} from {best or 'the final weights'}", flush=True)


def argument_problem(message: str) -> str:
    """jsonargparse's nested union errors boiled down to `key=value is not valid (expected type)` or `key.option is not accepted by class`."""
    keys = re.findall(r'Parser key "([^"]+)"', message)
    option = re.search(r"class_path '([\w.]+)':\s*Option '(\w+)' is not accepted", message)
    if keys and option:  # e.g. --data.num_workers, an option of CIFAR10DataModule, given to DeviceCIFAR10DataModule
        return f"{'.'.join(keys)}.{option.group(2)} is not accepted by {option.group(1)}"
    value = re.search(r"(?:Got|Given) value: (.*?)(?: - |$)", message, re.M)
    if not keys or not value:
        return message  # e.g. "Unrecognized arguments: --trainer.max_epochz 1" says it already
    expected = [
        t.rsplit(".", 1)[-1] for t in re.findall(r"Expected an? <class '([\w.]+)'>", message) if t != "NoneType"
    ]
    return f"{'.'.join(keys)}={value.group(1)} is not valid" + (f" (expected {expected[0]})" if expected else "")


def build_cli(argv: list[str]) -> CLI:
    """Parse trainer.yaml, then SageMaker's settings, then argv (later wins), and instantiate everything."""
    return CLI(
        ImageClassifier,
        CIFAR10Base,  # --data picks a pipeline by class name: DeviceCIFAR10DataModule or CIFAR10DataModule
        subclass_mode_data=True,
        args=sagemaker_env.trainer_args(os.environ, argv) + argv,
        run=False,
        parser_kwargs={"default_config_files": [TRAINER_YAML], "exit_on_error": False},
        trainer_defaults={"callbacks": [RankReport()]},
        save_config_kwargs={"overwrite": True},
    )


def configuration_problem(e: Exception) -> str:
    if "gpu" in str(e).lower() and not torch.cuda.is_available():
        return "trainer.accelerator asks for a GPU but this instance has none; use a GPU instance type or trainer.accelerator=cpu"
    return f"bad configuration: {e}"


def check_writable(config) -> None:
    """Fail at the start, not after hours of training, when an output directory cannot be written."""
    for key, path in (
        ("model_dir", config.model_dir),
        ("checkpoint.dirpath", config.checkpoint.dirpath),
        ("logger.save_dir", config.logger.save_dir),
    ):
        if not path or "://" in path:
            continue
        try:
            os.makedirs(path, exist_ok=True)
            tempfile.TemporaryFile(dir=path).close()
        except OSError as e:
            raise UserError(f"{key}={path} cannot be written ({e.strerror}); point it at a writable directory") from e


def run(argv: list[str]) -> None:
    try:
        cli = build_cli(argv)
    except (ValueError, TypeError, MisconfigurationException) as e:  # raised by a class built from the config
        raise UserError(configuration_problem(e)) from e
    check_writable(cli.config)
    dirpath = cli.config.checkpoint.dirpath  # on SageMaker /opt/ml/checkpoints, restored on a restarted job
    last = os.path.join(dirpath, "last.ckpt") if dirpath else None
    resume = last if last and os.path.isfile(last) else None
    cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=resume)
    if cli.config.model_dir:
        export(cli.trainer, cli.model, cli.parser.dump(cli.config, skip_unset=False), cli.config.model_dir)
    cli.trainer.strategy.barrier("exported")  # no host exits (ending a local-mode job) before rank 0 has written


def main(argv: list[str] | None = None) -> int:
    argv = sagemaker_env.sagemaker_values(sys.argv[1:] if argv is None else argv)
    try:
        run(argv)
    except UserError as e:
        return report(str(e))
    except ArgumentError as e:
        return report(f"bad hyperparameter: {argument_problem(str(e))}; python app/train.py --help lists them")
    except SIGTERMException:
        report(
            "stopped by SIGTERM (StopTrainingJob or a spot interruption) after saving last.ckpt; "
            "a job restarted with the same checkpoint location resumes from it"
        )
        return 128 + signal.SIGTERM
    except torch.OutOfMemoryError as e:
        return report(
            f"out of GPU memory ({str(e).splitlines()[0]}); lower data.batch_size, "
            "the batch of each process, or use an instance with more GPU memory"
        )
    except Exception as e:
        lost_peer = isinstance(e, (torch.distributed.DistError, RuntimeError)) and sagemaker_env.in_sagemaker(
            os.environ
        )
        if lost_peer and (line := sagemaker_env.peer_failure(os.environ, str(e), socket.gethostbyname)):
            return report(line)
        traceback.print_exc()  # unforeseen: the traceback, then the one line
        return report(f"{type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
