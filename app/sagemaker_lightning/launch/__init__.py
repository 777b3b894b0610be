"""Environment → launch plan, as pure functions; no torch (the start-up hook runs it in every Python process).

plan.py             the launch plan: hosts, ranks, launcher, timeout, paths, the variables to set
here.py             this process's plan, read once: the environment, the hyperparameters, this host
platforms/          which platform runs the job (SageMaker, torchrun, Kubeflow, Slurm) and what its variables say
paths.py            SageMaker's paths and files inside a training container
hyperparameters.py  hyperparameters.json, typed, as the trainer's arguments
network.py          NCCL's and gloo's interface, libfabric's EFA variables
instances.py        the instance table: GPUs, EFA, GPUDirect RDMA, published all-reduce busbw
"""
