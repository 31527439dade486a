"""References only the judge holds: they would solve an exercise outright, so they never reach a
student (``ag assign --release`` leaves hidden/ out) or a worker (it gets the top-level test files'
probes only)."""


def reachable_through_evicted(deps, i, evicted):
    """DTR's e*(i): breadth-first from node i over the edges of ``deps`` taken both ways (an input,
    a user), stepping only onto evicted nodes; i itself is never in it."""
    neighbours = [set(d) for d in deps]
    for k, d in enumerate(deps):
        for j in d:
            neighbours[j].add(k)
    allowed = set(evicted) - {i}
    found, frontier = set(), {i}
    while frontier:
        frontier = {m for k in frontier for m in neighbours[k] if m in allowed} - found
        found |= frontier
    return found
