"""Rematerialization: keep some activations (checkpoints), recompute the rest in backward.

The engine does the per-tensor work (``Tensor.rematerializer``: a value is discarded
once consumed and beamed back when a backward step reads it). This module builds on
it for a chain of layers ``x_k = layers[k](x_{k-1})``:

- ``plan(n, strategy, ...)`` chooses which layer outputs to keep;
- ``sequential(layers, x, checkpoints)`` runs the chain and wires the rematerializers;
- ``predict(chain, checkpoints)`` says what a plan costs (peak bytes, recomputed FLOPs);
- ``dynamic(layers, x, budget_bytes)`` evicts at run time, DTR-style, with no plan;
- ``checkpoint(fn, *inputs)`` is the function form (``torch.utils.checkpoint``, Megatron's
  and NeMo's recomputation): keep a block's inputs only, rerun the block in backward.

One concept per file: ``runner`` (sequential and its replay), ``cost`` (profile, predict),
``plans`` (the strategies), ``dtr`` (dynamic), ``function`` (checkpoint).
"""
from .cost import ChainProfile, Prediction, _segment_recompute, as_profile, predict, profile
from .dtr import dynamic
from .function import checkpoint
from .plans import (STRATEGIES, _every, _fits, _greedy, _local_peak, _num_layers, _optimal, _pareto, mode_for,
                    plan)
from .runner import Layer, _check_checkpoints, sequential

__all__ = ["STRATEGIES", "ChainProfile", "Layer", "Prediction", "as_profile", "checkpoint", "dynamic", "mode_for",
           "plan", "predict", "profile", "sequential"]
