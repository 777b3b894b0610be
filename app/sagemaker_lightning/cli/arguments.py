"""The command line a job's trainer parses: in a job, options without a subcommand run `fit` (SageMaker's launchers
start a script with options only); on SageMaker also its hyperparameters, typed from hyperparameters.json
(launch/hyperparameters.py), and the job's paths given before the user's arguments, so that theirs win:
checkpoint.dirpath, model_dir, trainer.default_root_dir, logger.save_dir (Plan.settings) and the data channel for the
data module's data_dir, or the argument LightningCLI(data_channels=...) names. Outside any job, only a command line
that Lightning's class would refuse for naming no subcommand runs fit; any other is Lightning's to parse.

    python app/example/train.py --trainer.max_epochs 1      # fit, as a job's command line runs
"""

from collections.abc import Mapping

from jsonargparse import ArgumentError

from sagemaker_lightning.cli import subcommands
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch import hyperparameters
from sagemaker_lightning.launch.plan import Plan

DEFAULT_DATA_KEY = "data_dir"  # the data module's argument that receives the data channel, unless data_channels says


def parse(parser, argv: list[str], plan: Plan, data_channels: Mapping[str, str] | None, subclass_data: bool = True):
    """The configuration `argv` gives in this job, or None where Lightning's own parsing applies. `subclass_data`: the
    data module is chosen by class (LightningCLI's subclass_mode_data), so its arguments are under data.init_args."""
    if not plan.on_sagemaker:
        return parser.parse_args(["fit", *argv]) if subcommands.implies_fit(argv, parser) else None
    argv = hyperparameters.merge(argv, plan.hyperparameters)
    position = subcommands.options_start(argv, parser)
    if position is None:  # options only, as SageMaker's launchers start a script: fit
        argv, position = ["fit", *argv], 1
    head, tail = argv[:position] + [f"--{key}={value}" for key, value in plan.settings().items()], argv[position:]
    name, tried, failed = _data_name(plan, data_channels), None, None
    if name and (data_dir := plan.data_dir(strict=False)):
        # given at once, as where most data modules take it: a parse is 0.1-0.2 s of start-up (docs/performance.md)
        tried = f"data.init_args.{name}" if subclass_data else f"data.{name}"
        try:
            return parser.parse_args([*head, f"--{tried}={data_dir}", *tail])
        except ArgumentError as e:
            failed = e  # the data module may not take it: the configuration without it tells
    config = parser.parse_args(head + tail)  # an error of the command line's own raises here
    key = _data_key(config, name, plan, data_channels)
    if failed and key == tried:
        raise failed  # the data module takes it: the channel's directory was what failed
    if key and (data_dir := plan.data_dir()):
        config = parser.parse_args([*head, f"--{key}={data_dir}", *tail])
    return config


def _data_name(plan: Plan, data_channels: Mapping[str, str] | None) -> str | None:
    """The data module's argument that receives the data channel, None where no argument does."""
    wanted = data_channels or {plan.data_channel: DEFAULT_DATA_KEY}
    return wanted.get(plan.data_channel)


def _data_key(config, name: str | None, plan: Plan, data_channels: Mapping[str, str] | None) -> str | None:
    """The configuration key of argument `name`, when the data module has it."""
    if name is None:
        return None
    sub = config.get("subcommand")
    for key in (f"data.{name}", f"data.init_args.{name}"):
        if key in (config[sub] if sub else config):
            return key
    if data_channels:
        raise UserError(
            f"data_channels maps {plan.data_channel!r} to {name!r}, which the data module does not take; name one of "
            "its arguments"
        )
    return None
