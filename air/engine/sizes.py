"""What one automaton instance costs in memory: the engine's size model.

The loader gives each node the bytes of one of its instances when it makes it
(``Node.inst_bytes``, :func:`per_instance_bytes`); the footprint
(air/engine/footprint.py) adds them up. It is kept apart from the footprint so
that the loader, which only needs the figure, imports nothing that works on a
whole engine. The sizes were calibrated against tracemalloc on CPython 3.11
(BENCHMARKS.md, "Memory of automaton state").
"""

from __future__ import annotations

#: An instance's own list (VALUES, T0, T1, BORN, DEAD; two more slots with a
#: sorted index), its values tuple's header, and the pointer that holds it in
#: its node's list or bucket, with the GC header and list over-allocation.
INSTANCE_BASE = 152
#: Each value: the tuple's pointer plus the object (an int above the small-int
#: cache, a float, a string of ~16 ASCII characters as symbols and names are;
#: a bool is a shared singleton).
VALUE_BYTES = {"int": 40, "float": 32, "string": 72, "bool": 8}
#: A sorted index's extra per instance: its key and install number, in three
#: parallel lists (network.SortedBucket).
SORTED_EXTRA = 72
#: Each AI bucket: its dict entry and key, and the bucket list's header.
BUCKET_BYTES = 136

_SIZES: dict[tuple, int] = {}


def instance_bytes(schema: tuple) -> int:
    """Estimated bytes of one instance of a state with this schema (a tuple of
    :class:`air.model.Attribute`); cached per schema."""
    got = _SIZES.get(schema)
    if got is None:
        got = INSTANCE_BASE + sum(VALUE_BYTES.get(a.type, 72) for a in schema)
        if len(_SIZES) < 100_000:
            _SIZES[schema] = got
    return got


def per_instance_bytes(schema: tuple, sorted_index: bool) -> int:
    """What a node's instance costs (``Node.inst_bytes``, set by the loader when it makes the node)."""
    return instance_bytes(schema) + (SORTED_EXTRA if sorted_index else 0)
