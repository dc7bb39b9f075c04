# The instance slot names of instance.py as C constants for the compiled build
# (network.pxd and runtime.pxd cimport them): indexing with them compiles to a
# constant index. instance.py itself is never compiled; keep the two equal
# (tests/engine/test_engine_build.py checks).

cdef enum:
    VALUES = 0
    T0 = 1
    T1 = 2
    BORN = 3
    DEAD = 4
    SORT_KEY = 5
    SORT_CID = 6
