"""Each platform's variables, one module a platform, each a pure function from an environment to a Cluster.

recognise.py  which platform runs this process, in order
cluster.py    what a platform's variables say (Cluster), and the rules the platforms share
sagemaker.py  SM_HOSTS, SM_CURRENT_HOST; the launcher SageMaker's distribution ran; LAUNCHER
torchrun.py   already under torchrun or hyperpodrun, on any platform
kubeflow.py   a PyTorchJob or TrainJob (PET_*), and torch's own MASTER_ADDR/RANK/WORLD_SIZE
slurm.py      the tasks srun started
"""
