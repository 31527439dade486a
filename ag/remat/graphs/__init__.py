"""Rematerialization on any graph (lecture 6, Checkmate's view): ``graph`` (the data), ``capture``
(records one training step), ``model`` (the one memory model: ``simulate``), ``schedule`` (R and S),
``execute`` (a schedule's events on the one runner, ``remat.runner``), the fixed plans as
schedules (``keep``, with ``chain_plans`` and ``nemo`` built on it), ``costly`` (the solvers'
warm start that keeps what costs FLOPs), the planners (``checkmate``, ``moccasin``, ``revolve``, ``dtr``), ``sweep`` (every planner
across budgets) and ``examples`` (the lecture's graphs). The package imports nothing itself:
``ag.remat`` gathers the public names."""
