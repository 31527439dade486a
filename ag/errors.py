"""The two errors ag raises of its own, besides TypeError and ValueError for bad arguments."""


class GraphError(RuntimeError):
    """Backward cannot run: the graph was freed or a value it needs is gone."""


class ShapeError(ValueError):
    """An op got shapes, axes or arguments it cannot work with."""
