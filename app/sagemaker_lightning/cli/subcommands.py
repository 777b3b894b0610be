"""Which subcommand a command line runs (pure functions of argv and the parser): the one argv names, one a
configuration file may choose, or `fit` for options only, as SageMaker's launchers start a script (cli/hub.py).

    python -c "from sagemaker_lightning.cli import subcommands; help(subcommands.options_start)"
"""


def _config_may_choose(argv: list[str], parser) -> bool:
    """Whether a configuration file may choose the subcommand (by nesting settings under it): one given in argv, the
    parser's default ones, or one from the environment (default_env: PL_CONFIG)."""
    given = any(t in ("-c", "--config") or t.startswith("--config=") for t in argv)
    return given or bool(parser.default_config_files) or bool(parser.default_env)


def _asks_help(argv: list[str]) -> bool:
    """Whether argv asks for the help, which without a subcommand lists the subcommands."""
    return any(t in ("-h", "--help") for t in argv)


def _named_at(argv: list[str], names) -> int | None:
    """The index of the subcommand among `names` that argv names, None where it names none."""
    expects_value = False
    for i, token in enumerate(argv):
        if expects_value:
            expects_value = False
        elif token in names:
            return i
        elif token.startswith("-"):
            expects_value = "=" not in token and token not in ("-h", "--help")
        else:
            return None  # a positional that is not a subcommand: the parser says what is wrong
    return None


def options_start(argv: list[str], parser) -> int | None:
    """Where options go: after the subcommand (its index + 1), at 0 without subcommands, None when the parser has
    subcommands but argv names none."""
    if parser._subcommands_action is None:
        return 0
    at = _named_at(argv, parser._subcommands_action.choices)  # Lightning's, and a project's own (subcommands())
    return None if at is None else at + 1


def run_by_job(argv, names, on_sagemaker: bool) -> str | None:
    """The subcommand a job's command line runs, known before the parser exists: the one among `names` it names, else
    fit on SageMaker (arguments.parse); None where only the parser can tell (off SageMaker a configuration file may
    choose it) or the arguments are not a command line."""
    if not isinstance(argv, list | tuple):
        return None
    at = _named_at(argv, names)
    return argv[at] if at is not None else "fit" if on_sagemaker else None


def implies_fit(argv: list[str], parser) -> bool:
    """Off SageMaker: whether argv gives options only, naming no subcommand, with no configuration file that could
    choose one, and not asking for the help; Lightning's class refuses it ("expected subcommand"), the runtime runs fit."""
    return options_start(argv, parser) is None and not _config_may_choose(argv, parser) and not _asks_help(argv)
