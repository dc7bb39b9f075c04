# Declarations for the compiled build of convert.py (see air/engine/build.py):
# convert.py runs unchanged as plain Python without them.

import cython

from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem, PyDict_Clear, PyDict_Size
from cpython.list cimport PyList_GET_ITEM, PyList_New, PyList_SET_ITEM
from cpython.unicode cimport PyUnicode_CheckExact, PyUnicode_GET_LENGTH
from libc.string cimport memchr, memcpy, memset
from libc.stdlib cimport malloc, calloc, free
from libc.stdint cimport uint32_t
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.tuple cimport (PyTuple_New, PyTuple_SET_ITEM, PyTuple_GET_ITEM, PyTuple_Check, PyTuple_CheckExact,
                            PyTuple_GET_SIZE)

from air.engine.runtime cimport Event


cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member
    void PyObject_GC_UnTrack(object)
    bint PyObject_IS_GC(object)
    object PyObject_Vectorcall(object callable, PyObject **args, size_t nargsf, PyObject *kwnames)
    Py_ssize_t Py_REFCNT(PyObject *)


#: A witness record made by one vectorcall: stream, t0, t1 and up to this many values.
cdef enum:
    MAX_VECTOR_VALUES = 29


cdef inline Py_ssize_t _slot_offset(descr):
    """Where a member descriptor's slot lies in its instances."""
    return (<PyMemberDescrObject *><PyObject *>descr).d_member.offset


cdef inline object _slot(object r, tuple offsets, Py_ssize_t i):
    """Field ``i`` of record ``r`` (a new reference), read from its slot."""
    cdef Py_ssize_t off = offsets[i]
    cdef PyObject *p = (<PyObject **>((<char *><PyObject *>r) + off))[0]
    if p == NULL:
        raise AttributeError(f"field {i} of {type(r).__name__} is not set")
    return <object>p


cdef inline tuple _slots(object r, tuple offsets, Py_ssize_t n):
    """Fields ``0..n-1`` of record ``r`` as a tuple."""
    cdef tuple out = PyTuple_New(n)
    cdef Py_ssize_t i
    for i in range(n):
        v = _slot(r, offsets, i)
        Py_INCREF(v)
        PyTuple_SET_ITEM(out, i, v)
    return out


cdef inline void _share_items(tuple t, dict strings, Py_ssize_t longest, Py_ssize_t most):
    """convert.py's ``shared_values`` in place: ``t`` is a tuple no one else holds yet (made here,
    or decoded and held by one list only). Each exact str of at most ``longest`` characters becomes
    the equal one ``strings`` holds, or is added to it (emptied first when it holds ``most``)."""
    cdef Py_ssize_t j
    cdef PyObject *old
    cdef PyObject *hit
    for j in range(PyTuple_GET_SIZE(t)):
        old = PyTuple_GET_ITEM(t, j)
        if not PyUnicode_CheckExact(<object>old) or PyUnicode_GET_LENGTH(<object>old) > longest:
            continue
        hit = PyDict_GetItem(strings, <object>old)
        if hit == NULL:
            if PyDict_Size(strings) >= most:
                PyDict_Clear(strings)
            PyDict_SetItem(strings, <object>old, <object>old)
        elif hit != old:
            Py_INCREF(<object>hit)
            PyTuple_SET_ITEM(t, j, <object>hit)
            Py_DECREF(<object>old)


cdef inline bint _sole_item(tuple row, Py_ssize_t i):
    """Whether ``row[i]`` is an exact tuple that ``row`` alone holds (free to share in place)."""
    cdef PyObject *p = PyTuple_GET_ITEM(row, i)
    return Py_REFCNT(p) == 1 and PyTuple_CheckExact(<object>p)


cdef inline bint _sole_tuple(list values, Py_ssize_t i):
    """Whether ``values[i]`` is an exact tuple that ``values`` alone holds (free to share in place)."""
    cdef PyObject *p = PyList_GET_ITEM(values, i)
    return Py_REFCNT(p) == 1 and PyTuple_CheckExact(<object>p)


cdef inline void _untrack(Event ev, values):
    """An event and its values leave the cyclic collector (they cannot be part of a cycle)."""
    if PyObject_IS_GC(ev):
        PyObject_GC_UnTrack(ev)
    if PyTuple_CheckExact(values):
        PyObject_GC_UnTrack(values)


cdef inline object _witness(object cls, object stream, Event ev):
    """``cls(stream, ev.t0, ev.t1, *ev.values)`` by one vectorcall."""
    cdef PyObject *args[3 + MAX_VECTOR_VALUES]
    cdef Py_ssize_t i, n
    values = ev.values
    t0 = ev.t0
    t1 = ev.t1
    if not PyTuple_CheckExact(values) or PyTuple_GET_SIZE(values) > MAX_VECTOR_VALUES:
        return cls(stream, t0, t1, *values)
    n = PyTuple_GET_SIZE(values)
    args[0] = <PyObject *>stream
    args[1] = <PyObject *>t0
    args[2] = <PyObject *>t1
    for i in range(n):
        args[3 + i] = PyTuple_GET_ITEM(values, i)
    return PyObject_Vectorcall(cls, args, 3 + n, NULL)


cdef inline Py_ssize_t _count_nonblank(bytes data):
    """The lines of ``data`` with a byte other than space, tab, CR (and the newline ending them)."""
    cdef const char *p = data
    cdef const char *nl
    cdef Py_ssize_t size = len(data), i = 0, count = 0
    cdef char c
    while i < size:
        c = p[i]
        if c == b' ' or c == b'\t' or c == b'\r':
            i += 1
            continue
        if c == b'\n':
            i += 1
            continue
        count += 1  # a byte that is not blank: the line counts; on to the next one
        nl = <const char *>memchr(p + i, b'\n', size - i)
        if nl == NULL:
            break
        i = nl - p + 1
    return count


cdef inline char *_put_be(char *q, Py_ssize_t v, int nbytes):
    """``v`` as ``nbytes`` big-endian bytes at ``q``; where they end."""
    cdef int i
    for i in range(nbytes):
        q[i] = <char>((v >> (8 * (nbytes - 1 - i))) & 0xFF)
    return q + nbytes


cdef inline char *_put_long(char *q, Py_ssize_t n, char tag16, char tag32):
    """A MessagePack header of ``n`` past its one-byte form: ``tag16`` and two bytes, or ``tag32`` and four."""
    if n < 0x10000:
        q[0] = tag16
        return _put_be(q + 1, n, 2)
    q[0] = tag32
    return _put_be(q + 1, n, 4)


cdef inline tuple _pack_lines(bytes data):
    """convert.py's ``pack_lines``: a pass that counts the lines and the bytes packed, one that writes."""
    cdef const char *p = data
    cdef const char *nl
    cdef char *q
    cdef char *z
    cdef Py_ssize_t size = len(data), i = 0, n = 0, total = 0, k, ln
    cdef uint32_t u
    while i < size:
        nl = <const char *>memchr(p + i, b'\n', size - i)
        if nl == NULL:
            break
        ln = nl - (p + i)
        total += ln + (2 if ln < 0x100 else (3 if ln < 0x10000 else 5))
        n += 1
        i += ln + 1
    total += 1 if n < 16 else (3 if n < 0x10000 else 5)
    out = PyBytes_FromStringAndSize(NULL, total)
    sizes = PyBytes_FromStringAndSize(NULL, n * 4)
    q = PyBytes_AS_STRING(out)
    z = PyBytes_AS_STRING(sizes)
    if n < 16:  # (an array: fixarray, array 16, array 32)
        q[0] = <char>(0x90 | n)
        q += 1
    else:
        q = _put_long(q, n, <char>0xdc, <char>0xdd)
    i = 0
    for k in range(n):
        nl = <const char *>memchr(p + i, b'\n', size - i)
        ln = nl - (p + i)
        if ln < 0x100:  # (a bin: bin 8, bin 16, bin 32)
            q[0] = <char>0xc4
            q[1] = <char>ln
            q += 2
        else:
            q = _put_long(q, ln, <char>0xc5, <char>0xc6)
        memcpy(q, p + i, ln)
        q += ln
        u = <uint32_t>ln
        memcpy(z + 4 * k, &u, 4)
        i += ln + 1
    return out, sizes


cdef inline bytes _numbered(bytes prefix, object seq, bytes payload):
    """``prefix + b"%d " % seq + payload``, made at its length and copied into."""
    cdef long long v = seq
    cdef unsigned long long u
    cdef char digits[21]
    cdef int nd = 0
    cdef Py_ssize_t np = len(prefix), nl = len(payload), size
    cdef char *q
    u = <unsigned long long>(-(v + 1)) + 1 if v < 0 else <unsigned long long>v
    while True:
        digits[20 - nd] = <char>(48 + u % 10)
        nd += 1
        u //= 10
        if u == 0:
            break
    if v < 0:
        digits[20 - nd] = b'-'
        nd += 1
    size = np + nd + 1 + nl
    out = PyBytes_FromStringAndSize(NULL, size)
    q = PyBytes_AS_STRING(out)
    memcpy(q, PyBytes_AS_STRING(prefix), np)
    memcpy(q + np, digits + 21 - nd, nd)
    q[np + nd] = b' '
    memcpy(q + np + nd + 1, PyBytes_AS_STRING(payload), nl)
    return out


cdef inline object _item(object t, Py_ssize_t i):
    """``t[i]``; read straight from a tuple's items, a named tuple's too (an engine's
    emission: Cython indexes a tuple's subclass by the generic protocol, 40 times slower)."""
    if PyTuple_Check(t) and 0 <= i < PyTuple_GET_SIZE(t):
        return <object>PyTuple_GET_ITEM(t, i)
    return t[i]


cdef inline tuple _runs_by_numbers(list emissions, dict numbers, list told, object out):
    """numbered_runs' compiled body (convert.py): a counting sort of the ``OUT`` emissions by the
    group of their subscription's number (C arrays, two passes over the batch; no list made a
    subscription). None, for the plain way, where an item is not a tuple of four (not an engine's
    emission) or an owner's number is past ``numbers``' size (never: numbers are dense from 0)."""
    cdef Py_ssize_t n = len(emissions), nk = len(numbers), ng = 0, total = 0, cur = -1, i, g, k, c, pos, j
    cdef Py_ssize_t *gid = NULL  # each emission's group, -1 for one of another kind
    cdef Py_ssize_t *slot = NULL  # each known number's group in this batch, -1 for none yet
    cdef Py_ssize_t *gcount = NULL  # each group's OUT emissions
    cdef Py_ssize_t *gfirst = NULL  # where its first OUT emission lies
    cdef Py_ssize_t *gnum = NULL  # its subscription's number, -1 for one not numbered yet
    cdef Py_ssize_t *gpos = NULL  # where its emissions go in ``grouped``
    cdef char *gone = NULL  # whether they are all on one stream
    cdef PyObject *last = NULL
    cdef PyObject *got
    cdef bint bad = False
    cdef dict fresh = {}
    cdef list others = [], grouped, owners = [], counts = [], kinds = [], nums = []
    cdef object owner, first
    cdef PyObject *em  # (borrowed, as the items read in the passes: no count written an emission)
    cdef PyObject *ownerp
    cdef PyObject *kindp
    cdef PyObject *streamp
    cdef PyObject *firstp
    if n == 0:
        return [], owners, counts, kinds, nums, others
    try:
        gid = <Py_ssize_t *>malloc(n * sizeof(Py_ssize_t))
        slot = <Py_ssize_t *>malloc((nk + 1) * sizeof(Py_ssize_t))
        gcount = <Py_ssize_t *>calloc(n, sizeof(Py_ssize_t))
        gfirst = <Py_ssize_t *>malloc(n * sizeof(Py_ssize_t))
        gnum = <Py_ssize_t *>malloc(n * sizeof(Py_ssize_t))
        gpos = <Py_ssize_t *>malloc(n * sizeof(Py_ssize_t))
        gone = <char *>malloc(n)
        if not (gid and slot and gcount and gfirst and gnum and gpos and gone):
            raise MemoryError()
        memset(slot, 0xff, (nk + 1) * sizeof(Py_ssize_t))
        for i in range(n):
            em = PyList_GET_ITEM(emissions, i)
            if not PyTuple_Check(<object>em) or PyTuple_GET_SIZE(<object>em) < 4:
                bad = True  # (not an engine's emission: the plain way says what is wrong with it)
                break
            ownerp = PyTuple_GET_ITEM(<object>em, 3)
            if ownerp != last:
                got = PyDict_GetItem(numbers, <object>ownerp)
                if got != NULL:
                    k = <object>got
                    if k < 0 or k >= nk:
                        bad = True
                        break
                    cur = slot[k]
                    if cur < 0:
                        cur = slot[k] = ng
                        gnum[ng] = k
                        ng += 1
                else:
                    got = PyDict_GetItem(fresh, <object>ownerp)
                    if got != NULL:
                        cur = <object>got
                    else:
                        cur = ng
                        fresh[<object>ownerp] = ng
                        gnum[ng] = -1
                        ng += 1
                last = ownerp
            kindp = PyTuple_GET_ITEM(<object>em, 2)
            if kindp == <PyObject *>out or <object>kindp == out:
                gid[i] = cur
                if gcount[cur] == 0:
                    gfirst[cur] = i
                    gone[cur] = 1
                elif gone[cur]:
                    streamp = PyTuple_GET_ITEM(<object>em, 0)
                    firstp = PyTuple_GET_ITEM(<object>PyList_GET_ITEM(emissions, gfirst[cur]), 0)
                    if streamp != firstp and <object>streamp != <object>firstp:
                        gone[cur] = 0
                gcount[cur] += 1
                total += 1
            else:
                gid[i] = -1
                others.append(<object>em)
        if bad:
            return None
        pos = 0
        for g in range(ng):  # the subscriptions with OUT emissions, in the order they first emitted
            c = gcount[g]
            gpos[g] = pos
            if c == 0:  # (RESUB emissions only: not numbered)
                continue
            first = <object>PyList_GET_ITEM(emissions, gfirst[g])
            owner = _item(first, 3)
            k = gnum[g]
            if k < 0:
                k = len(numbers)
                numbers[owner] = k
                told.append(k)
                told.append(owner)
            owners.append(owner)
            counts.append(c)
            nums.append(k)
            kinds.append(_item(first, 0) if gone[g] else None)
            pos += c
        grouped = PyList_New(total)
        for i in range(n):
            g = gid[i]
            if g >= 0:
                em = PyList_GET_ITEM(emissions, i)
                Py_INCREF(<object>em)
                PyList_SET_ITEM(grouped, gpos[g], <object>em)
                gpos[g] += 1
        pos = 0
        j = 0
        for g in range(ng):  # (a subscription on several streams: its emissions' each)
            c = gcount[g]
            if c == 0:
                continue
            if not gone[g]:
                kinds[j] = [_item(<object>PyList_GET_ITEM(grouped, i), 0) for i in range(pos, pos + c)]
            j += 1
            pos += c
        return grouped, owners, counts, kinds, nums, others
    finally:
        free(gid)
        free(slot)
        free(gcount)
        free(gfirst)
        free(gnum)
        free(gpos)
        free(gone)


cdef inline object _t1_of(Event ev):
    return ev.t1


cdef class Layout:
    cdef public object stream, getter, offsets, strings
    cdef public Py_ssize_t n


@cython.locals(layout=Layout, n=Py_ssize_t, out=list, longest=Py_ssize_t, most=Py_ssize_t)
cpdef list records_to_events(list records, dict layouts, times)

@cython.locals(out=list)
cpdef tuple shared_values(values, dict strings)

@cython.locals(out=list, i=Py_ssize_t, n=Py_ssize_t, longest=Py_ssize_t, most=Py_ssize_t)
cpdef list events_of(streams, list values, t0s, list t1s, dict strings)

@cython.locals(out=list, row=tuple, longest=Py_ssize_t, most=Py_ssize_t)
cpdef list events_of_rows(list rows, dict strings=*)

cdef object _shared_name(name, dict strings)

@cython.locals(ev=Event)
cdef object _event(stream, values, t0, t1)

@cython.locals(out=list, got=tuple)
cpdef list emissions_to_records(list emissions, dict makers, maker, bint include_resub, schema_of=*)

cpdef Py_ssize_t nonblank_lines(bytes data)

cpdef sort_by_t1(list events)

cpdef tuple pack_lines(bytes data)

@cython.locals(groups=dict, mine=list, grouped=list, other=bint)
cpdef tuple grouped_by_owner(list emissions)

@cython.locals(owners=list, counts=list, kinds=list, n=Py_ssize_t, start=Py_ssize_t, end=Py_ssize_t, one=bint,
               i=Py_ssize_t)
cpdef tuple runs_of(list emissions)

@cython.locals(got=tuple)
cpdef tuple numbered_runs(list emissions, dict numbers, list told)

@cython.locals(out=list)
cpdef list number_names(dict numbers, list names, list told)

@cython.locals(out=list, i=Py_ssize_t, k=Py_ssize_t)
cpdef list count_on(list lasts, list nums, list counts)

@cython.locals(count=Py_ssize_t)
cpdef Py_ssize_t times_given(list records) except -1

@cython.locals(ev=Event)
cpdef tuple t1_span(events)

@cython.locals(ev=Event)
cpdef bint t1_ordered(events) except -1

@cython.locals(ev=Event, values=list, t1s=list, t0s=list, streams=list, same=bint, i=Py_ssize_t)
cpdef tuple event_columns(events)

@cython.locals(ev=Event, counts=dict, run=Py_ssize_t)
cpdef dict stream_counts(events)

@cython.locals(out=list)
cpdef list numbered_lines(bytes prefix, seqs, payloads)
