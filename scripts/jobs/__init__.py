"""The parts of scripts/run_sagemaker.py, one concern a module; its main() wires them in this order:

    options.py  the command line (argparse)
    spec.py     the job it describes, resolved and checked (a frozen Job), before any SDK import
    outcome.py  the job run by its SDK; a local job's end read from its containers' exits (docker compose can say 0)
    sdk2.py     the job as SDK 2.x's Estimator; sdk3.py: as SDK 3.x's ModelTrainer
    dry_run.py  --dry-run: the CreateTrainingJob request printed, nothing sent
    watch.py    the job's log as it passes: each epoch's validation accuracy
`tune` adds, in this order:
    tuning.py   the tuning job around the training job, resolved and checked (a frozen Tuning)
    project.py  its --range keys asked of the project's own parser
    sdk2.tune, sdk3.tune  CreateHyperParameterTuningJob; children.py in local mode instead: the first children run
    best.py     `best TUNING_JOB`: the best child and its model.tar.gz

Each module's docstring shows its use. `python scripts/run_sagemaker.py` puts scripts/ first on sys.path, from any
working directory, and pytest's pythonpath (pyproject.toml) does too: `from jobs import spec` works in both.

    python scripts/run_sagemaker.py --help
"""
