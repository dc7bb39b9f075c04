"""/whoami (what the caller's token may do: the console hides the rest) and
/audit (who changed what: the audit log, server/security/audit.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from server.api.deps import AUTH_ERRORS, DaemonDep, needs
from server.api.errors import errors
from server.api.schemas import AuditOut, WhoAmIOut
from server.security import Principal

router = APIRouter(tags=["security"])

#: The actions the audit log records (server/security/audit.py).
ACTIONS = Literal["subscription.register", "subscription.delete", "stream.declare", "auth.failure",
                  "auth.throttled"]


@router.get("/whoami", response_model=WhoAmIOut, summary="What the caller's token may do",
            responses=errors(401, 429))
async def get_whoami(d: DaemonDep, who: Annotated[Principal, needs(None)]) -> WhoAmIOut:
    """The token's name, its scopes and the scopes they amount to
    (``effective_scopes``: admin has them all), and which subscriptions it
    reaches (``own``: those it registered; ``prefixes``: those so named). On a
    server without auth_tokens: no name, ``auth: false``, every scope. The
    console reads it to show only what the token can do."""
    return WhoAmIOut(auth=d.security.enabled, tls=d.security.tls is not None, **who.public())


@router.get("/audit", response_model=AuditOut, summary="The audit log: who changed what",
            responses=errors(*AUTH_ERRORS, 422))
async def get_audit(d: DaemonDep, who: Annotated[Principal, needs("admin")],
                    limit: int = Query(100, ge=1, le=10_000, description="At most this many records (the newest)."),
                    action: ACTIONS | None = Query(None, description="Only records of this action."),
                    token: str | None = Query(None, description="Only records of the token with this name."),
                    subscription: str | None = Query(None, description="Only records naming this subscription "
                                                                       "(its registration, its deletion)."),
                    address: str | None = Query(None, description="Only records from this client address.")
                    ) -> AuditOut:
    """The newest ``limit`` records of the audit log that match the filters,
    oldest first, across its rotated files (data_dir/audit): every
    registration, deletion and stream declaration with the name of the token
    that made it (never its secret) and the client's address, every refused
    token (``auth.failure``: missing, wrong, or without the scope or reach),
    and each address slowed down for sending wrong tokens
    (``auth.throttled``). ``more``: older records match too."""
    records, more = await run_in_threadpool(d.security.audit.read, limit, action=action, token=token,
                                            subscription=subscription, address=address)
    return AuditOut(records=records, more=more)
