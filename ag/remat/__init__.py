"""Rematerialization: keep some activations (checkpoints), recompute the rest in backward.

The engine does the per-tensor work (``Tensor.rematerializer``: a value is discarded
once consumed and beamed back when a backward step reads it). This module builds on
it for a chain of layers ``x_k = layers[k](x_{k-1})``:

- ``plan(n, strategy, ...)`` chooses which layer outputs to keep;
- ``sequential(layers, x, checkpoints)`` runs the chain and wires the rematerializers;
- ``predict(chain, checkpoints)`` says what a plan costs (peak bytes, recomputed FLOPs): it is
  the schedule ``sequential`` runs (``sequential_schedule``), priced by the graphs' one memory model;
- ``dynamic(layers, x, budget_bytes)`` evicts at run time, DTR-style, with no plan;
- ``checkpoint(fn, *inputs)`` is the function form (``torch.utils.checkpoint``, Megatron's
  and NeMo's recomputation): keep a block's inputs only, rerun the block in backward.

On any graph (Checkmate's view, Jain et al. 2020):

- ``capture(fn, *inputs)`` records one training step as a ``Graph`` of op outputs;
- a ``Schedule`` says, stage by stage, which nodes are computed (R) and kept (S);
- ``execute(schedule)`` runs it on the engine and measures its peak and recomputed FLOPs;
- ``checkmate(graph, budget_bytes)`` is the optimal schedule (a MILP, HiGHS), ``relax=True`` its LP rounding;
- ``moccasin(graph, budget_bytes, intervals=C)`` is the same problem as constraint programming (CP-SAT), each
  node computed at most C times;
- ``revolve(n_layers, slots)`` is Griewank's binomial schedule for chains, multi-level;
- ``dynamic(graph, budget_bytes)`` is DTR on any graph, at run time;
- ``from_keep``, ``chain_schedule`` and ``nemo`` write the fixed plans as schedules on a graph.

One runner computes every schedule's nodes (``runner``): made once with a graph, made again
without one into the same Tensors. Chains (lecture 3) live in ``chains/``: ``sequential`` (the
chain's layers on the runner, replayed by rematerializers), ``schedule`` (a
chain as a graph, a plan as R and S), ``cost`` (profile, sequential_schedule, predict), ``plans`` (the chain strategies), ``dtr`` (dynamic on a chain). Graphs (lecture 6) live
in ``graphs/``: ``graph`` (the data), ``capture``, ``model`` (the one memory model), ``schedule``,
``execute`` (a graph's ops on the runner, event by event), ``keep`` (a fixed set kept, as a schedule), ``chain_plans`` and
``nemo`` (the chain planners and NeMo's modes as such schedules), ``checkmate``, ``moccasin``,
``revolve``, ``dtr`` (dynamic on a graph), ``sweep`` and ``examples``. ``checkpoint`` sits beside
the engine (``ag/checkpoint.py``): ``nn`` uses it without this package.
"""
from ..checkpoint import checkpoint
from .chains.cost import ChainProfile, as_profile, predict, profile, sequential_schedule
from .chains.plans import STRATEGIES, mode_for, plan
from .chains.sequential import Layer, sequential
from .graphs import examples
from .graphs.capture import capture
from .graphs.bounds import carry_bound_bytes, lower_bound_bytes
from .graphs.checkmate import checkmate
from .graphs.dtr import HEURISTICS, DynamicRun, dynamic
from .graphs.execute import Execution, execute
from .graphs.graph import BackwardStep, CaptureError, Graph, Node
from .graphs.chain_plans import chain_schedule
from .graphs.keep import from_keep
from .graphs.nemo import nemo
from .graphs.model import Prediction, ScheduleError, simulate
from .graphs.moccasin import moccasin
from .graphs.revolve import Revolve, binomial_forwards, dp_forwards, one_level_forwards, revolve
from .graphs.schedule import Schedule

__all__ = ["HEURISTICS", "STRATEGIES", "BackwardStep", "CaptureError", "ChainProfile", "DynamicRun", "Execution",
           "Graph", "Layer", "Node", "Prediction", "Revolve", "Schedule", "ScheduleError", "as_profile",
           "binomial_forwards", "capture", "carry_bound_bytes", "chain_schedule", "checkmate", "checkpoint", "dp_forwards", "dynamic",
           "execute", "from_keep", "lower_bound_bytes", "moccasin", "mode_for", "nemo", "one_level_forwards", "plan", "predict",
           "profile", "revolve", "sequential", "sequential_schedule", "simulate"]
