"""NeMo's recomputation modes on a captured graph, found by the scopes ``nn`` names
(``scopes.scope("attention core")`` and ``"transformer layer"``), written as ``from_keep`` schedules."""
from __future__ import annotations

from ...nn import ATTENTION_CORE as CORE, TRANSFORMER_LAYER as LAYER
from .graph import Graph
from .keep import from_keep
from .schedule import Schedule


def nemo(graph: Graph, granularity: str) -> Schedule:
    """NeMo's ``activations_checkpoint_granularity`` on a graph captured from ``nn`` layers
    with none: "selective" keeps each attention core's inputs Q, K, V and reruns the whole core
    (QKᵀ, softmax, dropout, P·V) in backward, as Korthikanti et al.'s selective recomputation
    does; "full" keeps only each layer's output (the next layer's input)."""
    if granularity == "selective":
        cores = _each(graph, CORE)
        if not cores:
            raise ValueError("nemo: no node of this graph was made in an attention core; "
                             "capture an nn.TransformerLayer or Transformer")
        inside = set().union(*cores)
        return from_keep(graph, [i for i in range(graph.n) if i not in inside], "selective", blocks=cores)
    if granularity == "full":
        outputs = _last_of_each(graph, LAYER)
        if not outputs:
            raise ValueError("nemo: no node of this graph was made in a transformer layer; "
                             "capture an nn.TransformerLayer or Transformer")
        return from_keep(graph, sorted(outputs), "full")
    raise ValueError(f"nemo: granularity must be 'selective' or 'full', got {granularity!r}")


def _each(graph: Graph, name: str) -> list[set[int]]:
    """The nodes made in each entry of the scope ``name`` ("attention core#0", "#1", ...)."""
    made: dict[str, set[int]] = {}
    for node in graph.nodes:
        for s in node.scope:
            if s.rpartition("#")[0] == name:
                made.setdefault(s, set()).add(node.index)
    return list(made.values())


def _last_of_each(graph: Graph, name: str) -> set[int]:
    """The last node made in each entry of the scope ``name``."""
    return {max(block) for block in _each(graph, name)}
