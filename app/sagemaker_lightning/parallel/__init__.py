"""The trainer's distributed strategy; it shards, it does not save.

strategy.py       strategy, backend and timeout on the plan's cluster; the torchrun the plan starts
fsdp.py           trainer.strategy=fsdp: FullyShardedStrategy (FSDP2 through Lightning's ModelParallelStrategy)
fsdp_sharding.py  how FSDP2 shards a module: the fsdp settings, blocks, roots, activation checkpointing, buffers
lr_scaling.py     scale_lr_by_world_size: the linear learning-rate scaling rule
"""
