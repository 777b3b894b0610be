"""The parts of scripts/run_sagemaker.py, one concern a module; its main() wires them in this order:

    options.py  the command line (argparse)
    spec.py     the job it describes, resolved and checked (a frozen Job), before any SDK import
    sdk2.py     the job as SDK 2.x's Estimator; sdk3.py: as SDK 3.x's ModelTrainer
    dry_run.py  --dry-run: the CreateTrainingJob request printed, nothing sent
    watch.py    the job's log as it passes: each epoch's validation accuracy

Each module's docstring shows its use. `python scripts/run_sagemaker.py` puts scripts/ first on sys.path, from any
working directory, and pytest's pythonpath (pyproject.toml) does too: `from jobs import spec` works in both.

    python scripts/run_sagemaker.py --help
"""
