"""The slots of an automaton instance, by name.

An instance is a list (cheaper to make than an object), made only by
:func:`air.engine.network.new_instance`: ``[values, t0, t1, born, dead]`` —
the stored values in its node's schema, its interval, the generation its run
began in (an owner added later never sees it) and whether the current epoch
affected it. Once installed in a node with a sorted index it also carries its
key and install order (:class:`air.engine.network.SortedBucket`).

Index an instance with these names, never with numbers. ``runtime.py`` and
``network.py`` take them with ``from air.engine.instance import *``: in the
compiled build ``instance.pxd`` declares them as a C enum, so ``inst[T1]``
compiles to a constant index, exactly as ``inst[2]`` did (a plain import of a
name the ``.pxd`` declares does not compile, and a module attribute such as
``slot.T1`` would cost an attribute lookup in plain Python).
"""

__all__ = ["VALUES", "T0", "T1", "BORN", "DEAD", "SORT_KEY", "SORT_CID"]

VALUES = 0  #: tuple of stored values, in the node's schema order
T0 = 1  #: start time
T1 = 2  #: detection time (the epoch the instance was made in)
BORN = 3  #: the generation current when its run began
DEAD = 4  #: whether the current epoch affected it (deleted when the epoch closes)
SORT_KEY = 5  #: sorted index only: its key (a number, or None), appended when installed
SORT_CID = 6  #: sorted index only: its install order, appended after the key
