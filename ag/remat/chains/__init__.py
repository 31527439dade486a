"""Rematerialization on a chain of layers (lecture 3): ``sequential`` runs a chain keeping some outputs
and replaying the rest (its layers are nodes of the one runner, ``remat.runner``), ``schedule``
writes a chain as a graph and a plan as the R and S it runs, ``cost`` says what a plan costs (``profile``, ``sequential_schedule``, ``predict``),
``plans`` chooses the outputs to keep (``plan``), ``dtr`` evicts at run time (``dynamic_chain``).
The package imports nothing itself: ``ag.remat`` gathers the public names."""
