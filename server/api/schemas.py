"""Request and response bodies of the REST API."""

from __future__ import annotations

from contextvars import ContextVar
from functools import lru_cache
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from air.names import IDENTIFIER_PATTERN, IDENTIFIER_RULE, MAX_NAME_LENGTH, NAME_PATTERN, NAME_RULE, name_problem


class StreamIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "example": {"name": "Stock", "schema": {"Name": "string", "Price": "float", "Volume": "int"}}})

    name: str = Field(description=f"Stream name: {IDENTIFIER_RULE.removeprefix('a name is ')}",
                      json_schema_extra={"maxLength": MAX_NAME_LENGTH, "pattern": IDENTIFIER_PATTERN})
    schema_: dict[str, str] = Field(alias="schema", description="Attribute name -> type, in schema order; "
                                                                "attribute names follow the same rule")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        problem = name_problem(v, what="stream name", identifier=True)
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("schema_")
    @classmethod
    def _attribute_names(cls, v: dict[str, str]) -> dict[str, str]:
        for attr in v:
            problem = name_problem(attr, what="attribute name", identifier=True)
            if problem is not None:
                raise ValueError(problem)
        return v


class StreamOut(BaseModel):
    name: str
    schema_: dict[str, str] = Field(serialization_alias="schema")
    kind: str = Field(description="'declared' (an input stream) or 'published' (a subscription's output)")


#: The languages a query is written in, each a field of a registration body of its own: the one list the
#: body's refusals name ("send the query as 'cel' (CEL text) or 'air' (AIR XML)").
QUERY_LANGUAGES = {"cel": "CEL text", "air": "AIR XML", "sase": "SASE text"}


def query_fields() -> str:
    """``'cel' (CEL text) or 'air' (AIR XML)``: the fields a query may be sent in."""
    named = [f"{field!r} ({what})" for field, what in QUERY_LANGUAGES.items()]
    return ", ".join(named[:-1]) + f" or {named[-1]}" if len(named) > 1 else named[0]


class SubscriptionIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, json_schema_extra={
        "example": {"cel": "SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs"}})

    cel: str | None = Field(None, max_length=1_000_000, description="A CEL query")
    air: str | None = Field(None, max_length=4_000_000, description="AIR XML: one <NFA> or several in <NFAs>")
    sase: str | None = Field(None, max_length=1_000_000, description="A SASE query (docs/design/sase.md)")
    name: str | None = Field(None, description=f"An optional label: {NAME_RULE.removeprefix('a name is ')}",
                             json_schema_extra={"maxLength": MAX_NAME_LENGTH, "pattern": NAME_PATTERN})
    max_instances: int | None = Field(None, ge=1, description=(
        "An optional cap on its live instances (partial matches): above it, its oldest are shed down to 90% of "
        "it and it is marked inexact (server/budget.py)"))
    max_state_bytes: int | str | None = Field(None, description=(
        "An optional cap on the memory of its state, in bytes or as a size ('64MiB', '1GB', or '10%' of the "
        "server's max_state_bytes): above it, its oldest instances are shed and it is marked inexact"))
    from_: int | float | str | None = Field(None, alias="from", description=(
        "Run it over the retained history first (docs/design/backfill.md): an event time, 'retained' (all of "
        "it) or a duration before the newest event ('-24h', '-90m', '-30s', '-2d'); its historical witnesses "
        "come first, marked \"replay\": true, then it joins the live stream with no gap and no duplicate"))


    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        problem = None if v is None else name_problem(v, what="subscription name")  # the one rule: air/names.py
        if problem is not None:
            raise ValueError(problem)
        return v

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data):
        """An unknown field (``{"query": ...}``) is named with the fields a query goes in."""
        step = BETWEEN_ITEMS.get()
        if step is not None:
            step()
        if isinstance(data, dict):
            known = _field_names(cls)
            unknown = [k for k in data if k not in known]
            if unknown:
                others = ", ".join(f.alias or n for n, f in cls.model_fields.items() if n not in QUERY_LANGUAGES)
                raise ValueError(f"unknown field {str(unknown[0])[:100]!r}: send the query as {query_fields()} "
                                 f"(the other fields: {others})")
        return data

    @model_validator(mode="after")
    def _exactly_one(self):
        if [getattr(self, f) is None for f in QUERY_LANGUAGES].count(False) != 1:
            raise ValueError(f"give exactly one of {query_fields()}")
        return self

    @property
    def kind(self) -> str:
        for language in QUERY_LANGUAGES:  # (a loop, not next() of a generator: 10,000 of a batch in 7 ms, not 25)
            if getattr(self, language) is not None:
                return language
        raise AssertionError("validated with exactly one")

    @property
    def text(self) -> str:
        return getattr(self, self.kind)


#: Called before each query of a body is validated, when set (server/api/bodies.py sets a ``Courtesy`` for a
#: batch's: a thread validating 10,000 queries kept the interpreter's lock up to the switch interval each time
#: another thread wanted it, and the live events waited 100-150 ms).
BETWEEN_ITEMS: ContextVar[Callable[[], None] | None] = ContextVar("BETWEEN_ITEMS", default=None)


@lru_cache(maxsize=None)
def _field_names(model: type[BaseModel]) -> frozenset[str]:
    """The fields a body of ``model`` may have, as sent (a batch's 10,000 queries each asked for them: 40% of its
    validation)."""
    return frozenset(f.alias or n for n, f in model.model_fields.items())


#: The most subscriptions one batch registration may hold.
MAX_BATCH = 100_000


class PreviewIn(SubscriptionIn):
    """POST /subscriptions/preview: a query (as POST /subscriptions takes it), from when, how many witnesses."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True, json_schema_extra={
        "example": {"cel": "SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs", "from": "-1h",
                    "limit": 100}})

    limit: int = Field(100, ge=1, le=10_000, description="The most witnesses returned (their count is all of them)")


class PreviewOut(BaseModel):
    witnesses: list[dict[str, Any]]
    count: int = Field(description="Witnesses over the whole range (witnesses holds the first limit of them)")
    from_: Any = Field(alias="from", serialization_alias="from", description="The event time history was read from")
    to: Any = Field(description="The event time of the last event read")
    events: int = Field(description="Events read from history")
    truncated: bool


class SubscriptionBatchIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {"subscriptions": [
        {"cel": "FILTER{Name = 'IBM'}(Stock) NEXT{$1.Name = $2.Name AND $2.Price > 1.05 * $1.Price} Stock"},
        {"cel": "FILTER{Name = 'MSFT'}(Stock) NEXT{$1.Name = $2.Name AND $2.Price > 1.05 * $1.Price} Stock"}]}})

    subscriptions: list[SubscriptionIn] = Field(min_length=1, max_length=MAX_BATCH,
                                                description="Registered in this order, with consecutive ids")


class SubscriptionOut(BaseModel):
    id: str
    kind: str
    name: str | None
    outputs: list[str]
    internal_streams: list[str]
    created: float
    instances: int
    websocket: str
    #: False once it has lost partial matches to shedding (the state budget or its cap): its
    #: witnesses after ``inexact.since_seq`` may lack some. Stays so until it is deleted.
    exact: bool = True
    #: Since when, why and how much it lost (None while exact).
    inexact: dict[str, Any] | None = None
    #: Its own caps (max_instances, max_state_bytes), None for none.
    limits: dict[str, Any] | None = None
    #: Set when its stored query no longer compiles against this server's configuration (a stream
    #: it reads was removed, a type changed): ``reason``, ``since`` (when it first broke), ``upstream``
    #: (the broken subscription whose outputs it reads, if that is why), ``fix``. It is kept but does not
    #: run; it comes back by itself at a start whose configuration fits it, or is deleted.
    broken: dict[str, Any] | None = None
    #: Registered with "from": its run over history (docs/design/backfill.md): from, to (the cut's event
    #: time once known), events_done, events_total, witnesses, state (running, handing_over, live, failed),
    #: error. None when registered without from.
    backfill: dict[str, Any] | None = None


class WarningOut(BaseModel):
    """Something a query does that it may not mean to; it registers anyway.
    Today one kind (air/boundwarn.py): a NEXT or FOLD (an AIR state) that keeps
    automaton instances without a time bound."""
    model_config = ConfigDict(json_schema_extra={"example": {
        "code": "unbounded_instances",
        "message": "NEXT keeps each partial match until a later Stock event satisfies its condition; those that "
                   "no event ever satisfies are kept as long as the server runs",
        "fix": "add a time bound inside the braces: NEXT{... AND DUR < 1 HOUR} (any bound will do: a match older "
               "than it is dropped)",
        "automaton": "Rising", "state": "1", "stream": "Stock", "operator": "NEXT", "line": 1, "column": 59,
        "excerpt": "  SELECT ... FROM Stock NEXT{$1.Name = $2.Name AND ...} Stock PUBLISH Rising\n"
                   "                       ^"}})

    code: str = Field(description="What it is, stable for clients to match: 'unbounded_instances' (instances "
                                  "that no event affects are kept for as long as the server runs)")
    message: str = Field(description="What the query does, in one sentence")
    fix: str = Field(description="How to change the query, e.g. add 'AND DUR < 1 HOUR' inside NEXT{...}")
    automaton: str = Field(description="The automaton (its name) holding the instances")
    state: str = Field(description="The state (its id in the AIR) holding the instances")
    stream: str = Field(description="The stream whose events the instances wait for")
    operator: str | None = Field(description="CEL: the clause responsible, 'NEXT' or 'FOLD'; AIR: null")
    line: int = Field(description="Where in the text (1-based): CEL, the NEXT or FOLD keyword; AIR, the <Node> "
                                  "(0 when not known)")
    column: int = Field(description="Column of that keyword (1-based; 0 for AIR)")
    excerpt: str = Field(description="That line of the text, with a caret under the column")


_WARNINGS = ("What the registration warns of (it registered nonetheless): each clause that keeps automaton "
             "instances without a time bound, with its position and the fix; empty when none")


class SubscriptionRegistered(SubscriptionOut):
    warnings: list[WarningOut] = Field(default_factory=list, description=_WARNINGS)


class SubscriptionCreated(SubscriptionRegistered):
    #: Subscriptions registered before with the identical query (same kind and text): this one
    #: duplicates their witnesses. Register with a ``name`` to get the existing one back instead.
    same_as: list[str] = []
    #: False when a subscription with this name and this very query existed and is returned (status 200).
    registered_now: bool = True


class SubscriptionDetail(SubscriptionOut):
    text: str
    #: Its automata as AIR ("" while it is broken: it has none)
    air: str
    #: The seq of its newest witness (0: none yet): a client that wants every witness
    #: from now on connects to its WebSocket with ?from=<last_seq + 1>.
    last_seq: int = 0
    #: Set while the state budget's last check found it a runaway: what it costs the engine.
    runaway: dict[str, Any] | None = None
    #: Where its automata run: "engine thread", or "worker N" (engine_workers).
    runs_on: str = "engine thread"


class ValidationOut(BaseModel):
    valid: bool
    errors: list[dict[str, Any]]
    outputs: list[str] = []
    air: str | None = None
    warnings: list[WarningOut] = Field(default_factory=list, description=(
        "What registering it would warn of (a warning does not make it invalid): each clause that keeps automaton "
        "instances without a time bound, with its position and the fix; empty when none or when it does not "
        "compile"))


class EventsOut(BaseModel):
    accepted: int
    rejected: list[dict[str, Any]]
    late: int


class SubscriptionBatchOut(BaseModel):
    subscriptions: list[SubscriptionRegistered] = Field(description="In the order given, each with its warnings")


class DiskFullOut(BaseModel):
    part: str = Field(description="The part of the data directory that cannot be written: journal, "
                                  "witness_log, store or snapshot")
    path: str = Field(description="The file or directory the write failed on")
    reason: str = Field(description="The operating system's reason (e.g. 'No space left on device')")


class ErrorOut(BaseModel):
    """Every 4xx and 5xx answer of the API: ``detail`` says what went wrong and
    what to do; the other fields come with the answers that need them."""
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "example": {"detail": "no subscription 's7'; GET /subscriptions lists them"}})

    detail: str = Field(description="What went wrong and what to do about it, in one message")
    errors: list[dict[str, Any]] | None = Field(
        None, description="400: each error of the query (or of each query of a batch, with its 'index'): "
                          "'message', 'line', 'column', a caret 'excerpt'; 422: each problem of the request, "
                          "as 'where' (e.g. body.name) and 'problem'")
    readers: list[str] | None = Field(None, description="409 on DELETE: the subscriptions that read its outputs "
                                                        "(delete them first, or use cascade=true)")
    accepted: int | None = Field(None, description="507 on POST /events: how many of the events were accepted")
    not_accepted_from: int | None = Field(None, description="507 on POST /events: the index of the body's first "
                                                            "item not accepted (send it and the later ones again)")
    disk_full: DiskFullOut | None = Field(None, description="507: which part of the data directory cannot be "
                                                            "written")
    missing_scope: str | None = Field(None, description="403: the scope the token lacks (ingest, watch, manage, "
                                                        "metrics, admin); null when it has the scope but does not "
                                                        "reach the subscription or stream")
    retained: dict[str, Any] | None = Field(None, description="400 for a 'from' (registration, preview): the range "
                                                        "of event times the server retains, as 'from' and 'to' "
                                                        "(null when it retains none)")


class ProbeOut(BaseModel):
    status: str = Field(description="/livez: 'alive' or 'dead'; /readyz: 'ok', 'warning', 'starting', "
                                    "'degraded' or 'draining'")
    reason: str | None = Field(None, description="Why, when it is not plainly fine")


class WhoAmIOut(BaseModel):
    auth: bool = Field(description="Whether the server wants tokens at all (auth_tokens is set)")
    tls: bool = Field(description="Whether the server speaks TLS (tls_certfile is set)")
    name: str | None = Field(description="The token's name in auth_tokens (never its secret); null without tokens")
    scopes: list[str] = Field(description="The scopes given to the token")
    effective_scopes: list[str] = Field(description="What they amount to: admin has every scope")
    own: bool = Field(description="It reaches only the subscriptions it registered (and those its prefixes name)")
    prefixes: list[str] = Field(description="It reaches the subscriptions whose name starts with one of these")


class AuditOut(BaseModel):
    records: list[dict[str, Any]] = Field(description="Audit records, oldest first: 'time' (UTC), 'action', "
                                                      "'token' (its name), 'address', 'port', and what the action "
                                                      "needs ('subscriptions', 'names', 'stream', 'schema', "
                                                      "'reason', 'what', 'failures', 'wait_seconds')")
    more: bool = Field(description="Older records match the filters too (raise limit, or narrow them)")
