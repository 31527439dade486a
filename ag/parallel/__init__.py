"""Parallelism over real MPI processes, one module a scheme, over one communicator (``mpi``).

    tensor_parallel   Megatron-LM's tensor and sequence parallelism: one layer split across t ranks
    zero              ZeRO's stages 1-3: data parallelism with optimizer state, grads and params sharded
    pipeline          GPipe and 1F1B: a stack of layers cut into p stages, m micro-batches flowing through

``python -m ag.parallel`` under mpiexec runs the tensor-parallel check (``ag demo parallel``).
"""
from .mpi import Group
from .tensor_parallel import (SETTINGS, ColumnParallelLinear, ParallelTransformerLayer, RowParallelLinear,
                              check_gradients, copy_to_tensor_region, gathered_linear, main, measure,
                              reduce_from_tensor_region, reduce_scatter_to_sequence_region)

__all__ = ["Group", "SETTINGS", "ColumnParallelLinear", "ParallelTransformerLayer", "RowParallelLinear",
           "check_gradients", "copy_to_tensor_region", "gathered_linear", "main", "measure",
           "reduce_from_tensor_region", "reduce_scatter_to_sequence_region"]
