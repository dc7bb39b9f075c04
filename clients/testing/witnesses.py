"""Collecting a subscription's witnesses in a test: the first ``n`` of a
live watch (:func:`collect`), or the numbered ones a server keeps in its
witness log (:func:`logged_witnesses`)."""

from __future__ import annotations

from collections.abc import Iterable

from clients.client import CayugaClient, is_control


def collect(matches: Iterable[dict], n: int) -> list[dict]:
    """The first ``n`` witnesses of ``matches`` (what :meth:`CayugaClient.watch`
    yields); fewer only if the watch ends first. Give the watch a ``timeout``
    so that a missing witness fails the test instead of hanging it."""
    out: list[dict] = []
    if n <= 0:
        return out
    for w in matches:
        out.append(w)
        if len(out) == n:
            break
    return out


def logged_witnesses(base_url: str, subscription: str, upto: int, timeout: float = 30.0
                     ) -> list[tuple[int, str]]:
    """The witnesses of ``subscription`` from number 1 on, as the server serves
    them from its witness log (``?from=1``): ``(number, witness JSON)`` pairs,
    in order, read until the message that holds number ``upto`` (which may
    hold later ones too). ``timeout`` bounds the wait for each message; raises
    AssertionError when the server closes the socket before witness ``upto``."""
    got: list[tuple[int, str]] = []
    if upto <= 0:
        return got
    with CayugaClient(base_url, timeout=timeout) as client:
        with client.frames(subscription, from_=1, batch=1000, timeout=timeout) as frames:
            for msg in frames:
                if is_control(msg):
                    continue
                for line in msg.split("\n"):
                    seq, _, body = line.partition(" ")
                    got.append((int(seq), body))
                if got[-1][0] >= upto:
                    return got
    raise AssertionError(f"the server closed the witness log of {subscription} at witness "
                         f"{got[-1][0] if got else 0}, before {upto}")
