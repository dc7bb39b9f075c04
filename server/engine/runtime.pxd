# Declarations for the optional compiled build (see server/engine/build.py and
# network.pxd): runtime.py runs unchanged as plain Python without them.

import cython

from server.engine.network cimport EqIndex, NEdge, Node, SortedBucket, StreamPlan, untrack_instances


cdef class Event:
    cdef public object stream, values, t0, t1


@cython.locals(bucket=SortedBucket, i=Py_ssize_t)
cpdef list _affectable(iq, bucket, e)


cdef class Engine:
    cdef public object functions, on_emit, stats, options, _net
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

    @cython.locals(plan=StreamPlan, edges=list, found=list, dirty=list, edge=NEdge, dest=Node, nodes=list,
                   node=Node, k=Py_ssize_t, inst=list, rebind=NEdge, forwards=list, new=list,
                   overlap=bint)
    cpdef _process(self, Event ev)

    @cython.locals(dest=Node)
    cpdef _emit(self, dest, list inst)
