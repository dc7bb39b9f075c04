# Declarations for the optional compiled build (see air/engine/build.py):
# network.py stays the source of truth and runs as plain Python without them.
# With Cython, these classes become C structs whose fields are read without a
# dictionary or descriptor lookup. Fields are in the order the event loop
# touches them (runtime.py: _process, then close_epoch), so the hot ones of a
# node share its first cache lines.

cimport cython

from air.engine.instance cimport *

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object)
    bint PyObject_IS_GC(object)


cpdef list new_instance(values, t0, t1, born)

@cython.locals(inst=list)
cpdef untrack_instances(list insts)

cpdef untrack_events(events)

@cython.locals(plan=StreamPlan, node=Node, group=tuple)
cpdef list live_node_list(list plans, list dirty)

@cython.locals(node=Node, n=Py_ssize_t, total=Py_ssize_t, insts=Py_ssize_t, count=Py_ssize_t, v=double)
cpdef tuple tally_nodes(list nodes, double floor, Py_ssize_t bucket_bytes)

@cython.locals(lo=Py_ssize_t, hi=Py_ssize_t, mid=Py_ssize_t, xd=double, kd=double, below=bint)
cpdef Py_ssize_t _bisect_keys(list keys, object x, bint right) except -1


cdef class NEdge
cdef class Node
cdef class StreamPlan


cdef class SortedBucket:
    cdef public list keys, cids, insts, rest

    # (C calls from the engine's epoch end, not method lookups)
    @cython.locals(i=Py_ssize_t)
    cpdef add(self, key, cid, list inst)

    @cython.locals(i=Py_ssize_t, cids=list)
    cpdef remove(self, list inst)


@cython.locals(bucket=SortedBucket, insts=list, keys=list)
cpdef list affectable(iq, bucket, e)


cdef class EqIndex:
    cdef public dict groups
    cdef public Py_ssize_t size

    cpdef probe(self, e, list out)


cdef class NEdge:
    cdef public Py_ssize_t seq
    cdef public object run, smap
    cdef public Node dest
    cdef public bint resets
    cdef public object min_gen
    cdef public Node src
    cdef public object pred, rest, eq, sig
    cdef public dict owners
    cdef public bint indexed, is_start


cdef class Node:
    cdef public Py_ssize_t seq, ai_ev
    cdef public object iq
    cdef public list instances
    cdef public object filter_run
    cdef public NEdge rebind
    cdef public list forwards
    cdef public object fr
    cdef public bint dirty, active
    cdef public list pending
    cdef public object stream, outputs
    cdef public Py_ssize_t ndead, count
    cdef public object dead_keys
    cdef public bint is_start
    cdef public dict buckets
    cdef public Py_ssize_t ai_node
    cdef public object plan, label, schema, filter_full, an, fr_scan, children
    cdef public dict owners
    cdef public object min_gen
    cdef public bint shareable
    cdef public object merge_key
    cdef public bint alive
    cdef public object horizon
    cdef public Py_ssize_t inst_bytes


cdef class StreamPlan:
    cdef public object name
    cdef public EqIndex start_index
    cdef public list start_scan_list
    cdef public EqIndex an_index
    cdef public dict active_scan
    cdef public Py_ssize_t nodes, start_edges
