"""Experiment tracking in MLflow: one run a job, continued across restarts; and the trainer's TensorBoard logger.

tracker.py     the trainer's side: which run, its metrics from the trainer's hooks, a project's MLFlowLogger
mlflow_run.py  the run itself, written from a thread of its own
tensorboard.py the trainer's logger where the project names none: TensorBoard under logger.save_dir
"""
