"""The error answers each operation declares in the OpenAPI document: every
4xx and 5xx it can give, each with the one error body (:class:`ErrorOut`) and
a description a client generator can show."""

from __future__ import annotations

from server.api.schemas import ErrorOut

#: What each status means, wherever the API answers it; an operation may say more.
MEANINGS = {
    400: "The request cannot be used as it is: the body says why (for a query, each error with its position)",
    401: "Missing or wrong token: the server has auth_tokens set; send 'Authorization: Bearer <token>'",
    403: "The token lacks the scope the operation needs ('missing_scope' names it) or does not reach the "
         "subscription, or a server limit is reached (max_subscriptions): the body says which",
    404: "No such resource: the body says where to find the existing ones",
    409: "Conflicts with what exists: the body says with what",
    413: "The body is larger than max_body_bytes (or holds too many items): split it",
    415: "The body is not JSON: send it with content-type: application/json",
    429: "Too many wrong tokens came from this address: it is slowed down; retry after Retry-After seconds "
         "with a token of the server",
    422: "The request does not match its schema: 'errors' lists each problem with where it is",
    503: "The server cannot do it now (starting, stopping, or the engine thread is busy): retry; "
         "Retry-After says when, where known",
    507: "The data directory cannot be written (a full disk): nothing changed unless the body says so; "
         "free space, then retry",
}


def errors(*codes: int, why: dict[int, str] | None = None) -> dict[int | str, dict]:
    """``responses=`` for a route: each of ``codes`` with :class:`ErrorOut` and
    its meaning (``why`` replaces the general one for this operation)."""
    why = why or {}
    return {code: {"model": ErrorOut, "description": why.get(code, MEANINGS[code])} for code in codes}
