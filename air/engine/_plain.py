"""What ``cython``'s class decorators do in plain Python without Cython
installed: nothing (``runtime.py`` imports this in its place)."""


def cclass(cls):
    return cls


no_gc = cclass


def freelist(_size):
    return cclass
