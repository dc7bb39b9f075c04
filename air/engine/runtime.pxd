# Declarations for the optional compiled build (see air/engine/build.py and
# network.pxd): runtime.py runs unchanged as plain Python without them.

import cython

from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.ref cimport PyObject, Py_INCREF
from cpython.tuple cimport PyTuple_CheckExact, PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_SET_ITEM

from air.engine.instance cimport *
from air.engine.network cimport (EqIndex, NEdge, Node, SortedBucket, StreamPlan, affectable, new_instance,
                                 untrack_instances)


cdef extern from *:
    void __builtin_prefetch(const void *addr)

cdef extern from "Python.h":
    ctypedef struct PyListObject:
        PyObject **ob_item


#: CPython's GC header sits before a tracked object; freeing a consumed instance reads it
#: (PyObject_GC_UnTrack), often from a cache line of its own.
cdef enum:
    GC_HEADER = 16


cdef inline void _prefetch(list nodes):
    """Ask the memory system for what the event loop will read of every
    candidate node — its first instance (list, item array, values and their
    objects) and its first forward edge with the destination's pending list —
    before the loop reads any of it, one level at a time across all nodes: the
    misses of different nodes then overlap instead of coming one after
    another (at K = 10,000 `increasing` touches ~100 cold lines per event).
    Only the compiled build can; it changes no result."""
    cdef Py_ssize_t i, j, n = PyList_GET_SIZE(nodes)
    cdef Node node
    cdef NEdge edge
    cdef PyObject *p
    cdef PyObject *insts[64]
    cdef PyObject *fwds[64]
    if n > 64:
        n = 64
    for i in range(n):  # level 1: the lists of instances and of forward edges
        node = <Node>PyList_GET_ITEM(nodes, i)
        insts[i] = NULL
        fwds[i] = NULL
        if node.ai_ev < 0:
            insts[i] = <PyObject *>node.instances
            __builtin_prefetch(insts[i])
        if node.fr is None:
            fwds[i] = <PyObject *>node.forwards
            __builtin_prefetch(fwds[i])
    for i in range(n):  # 2: their item arrays
        if insts[i] != NULL:
            if PyList_GET_SIZE(<object>insts[i]):
                __builtin_prefetch((<PyListObject *>insts[i]).ob_item)
            else:
                insts[i] = NULL
        if fwds[i] != NULL:
            if PyList_GET_SIZE(<object>fwds[i]):
                __builtin_prefetch((<PyListObject *>fwds[i]).ob_item)
            else:
                fwds[i] = NULL
    for i in range(n):  # 3: the first instance (with the GC header before it), the first edge
        if insts[i] != NULL:
            insts[i] = (<PyListObject *>insts[i]).ob_item[0]
            __builtin_prefetch(insts[i])
            __builtin_prefetch(<char *>insts[i] - GC_HEADER)
        if fwds[i] != NULL:
            fwds[i] = (<PyListObject *>fwds[i]).ob_item[0]
            __builtin_prefetch(fwds[i])
    for i in range(n):  # 4: the instance's item array, the edge's destination node
        if insts[i] != NULL:
            __builtin_prefetch((<PyListObject *>insts[i]).ob_item)
        if fwds[i] != NULL:
            edge = <NEdge>fwds[i]
            fwds[i] = <PyObject *>edge.dest if edge.dest is not None else NULL
            __builtin_prefetch(fwds[i])
    for i in range(n):  # 5: its values (and their GC header) and start time, the destination's pending list
        if insts[i] != NULL:
            __builtin_prefetch((<PyListObject *>insts[i]).ob_item[0])
            __builtin_prefetch(<char *>(<PyListObject *>insts[i]).ob_item[0] - GC_HEADER)
            __builtin_prefetch((<PyListObject *>insts[i]).ob_item[1])
        if fwds[i] != NULL:
            node = <Node>fwds[i]
            fwds[i] = <PyObject *>node.pending
            __builtin_prefetch(fwds[i])
    for i in range(n):  # 6: the values themselves, the pending list's item array
        if insts[i] != NULL:
            p = (<PyListObject *>insts[i]).ob_item[0]
            if PyTuple_CheckExact(<object>p):
                for j in range(min(PyTuple_GET_SIZE(<object>p), 4)):
                    __builtin_prefetch(PyTuple_GET_ITEM(<object>p, j))
        if fwds[i] != NULL and (<PyListObject *>fwds[i]).ob_item != NULL:
            __builtin_prefetch((<PyListObject *>fwds[i]).ob_item)


cdef class Event:
    cdef public object stream, values, t0, t1


cdef extern from *:
    """
    /* Python 3.14 keeps a tuple's hash in it, set to "not yet" where tuples are made: there a
       subclass's tuple is made by tuple.__new__ (_new_emission), not allocated and filled here. */
    #if PY_VERSION_HEX >= 0x030E0000
    #define CAYUGA_FILLED_TUPLES 0
    #else
    #define CAYUGA_FILLED_TUPLES 1
    #endif
    static inline PyObject *cayuga_alloc_tuple(PyObject *cls, Py_ssize_t n) {
        return PyType_GenericAlloc((PyTypeObject *)cls, n);
    }
    """
    enum: CAYUGA_FILLED_TUPLES
    object cayuga_alloc_tuple(object cls, Py_ssize_t n)


cdef inline object _new_emission(object cls, object stream, object ev, object kind, object owner):
    """``tuple.__new__(cls, (stream, ev, kind, owner))`` (``cls`` a named tuple of four: the engine's
    ``Emission``) made as ``tuple.__new__`` makes a subclass's, without the tuple of its items first
    nor a call of ``tuple.__new__`` (90 ns a witness: BENCHMARKS.md, round 37)."""
    if not CAYUGA_FILLED_TUPLES:
        return tuple.__new__(cls, (stream, ev, kind, owner))
    cdef object em = cayuga_alloc_tuple(cls, 4)
    Py_INCREF(stream)
    PyTuple_SET_ITEM(em, 0, stream)
    Py_INCREF(ev)
    PyTuple_SET_ITEM(em, 1, ev)
    Py_INCREF(kind)
    PyTuple_SET_ITEM(em, 2, kind)
    Py_INCREF(owner)
    PyTuple_SET_ITEM(em, 3, owner)
    return em


@cython.locals(n=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t, s=Py_ssize_t, node=Node, other=Node)
cdef _sort_nodes(list nodes)

@cython.locals(n=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t, s=Py_ssize_t, edge=NEdge, other=NEdge)
cdef _sort_edges(list edges)


cdef class Engine:
    cdef public object functions, on_emit, _stats, options, _net
    # counted by the event loop, not yet added to ``_stats`` (the ``stats`` property adds them)
    cdef public Py_ssize_t _events_n, _epochs_n, _witnesses_n
    cdef public dict _declared, _published, _loaded, _readers
    cdef public object _gen, _epoch, _installed_t1
    cdef public bint _closed
    cdef public Py_ssize_t _epoch_events
    cdef public list _dirty
    cdef public object _resub, _cids

    @cython.locals(node=Node, pending=list, gone=list, ndead=Py_ssize_t, buckets=dict, b=list, kept=list)
    cpdef close_epoch(self)

    @cython.locals(node=Node, buckets=dict, b=SortedBucket, k=Py_ssize_t, pending=list, inst=list)
    cpdef _close_sorted(self, node)

    # (typed: an event's t1 read from its struct, not by a property through the generic attribute lookup)
    cpdef feed(self, Event event)

    @cython.locals(plan=StreamPlan, edges=list, found=list, dirty=list, edge=NEdge, dest=Node, nodes=list,
                   node=Node, k=Py_ssize_t, inst=list, rebind=NEdge, forwards=list, new=list,
                   overlap=bint)
    cpdef _process(self, Event ev)

    @cython.locals(dest=Node)
    cpdef _emit(self, dest, list inst)
