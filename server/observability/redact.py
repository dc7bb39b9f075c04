"""No secret in a log line: the auth token a client puts in a query string
(``?token=...``: what a browser's WebSocket can send) is replaced by ``***`` in
every record of uvicorn's loggers, the access log ("GET /x?token=... 200") and
its WebSocket lines ("WebSocket /ws/...?token=... [accepted]")."""

from __future__ import annotations

import logging
import re

#: A query parameter that carries a secret, with its value.
SECRET_PARAM = re.compile(r"([?&](?:token|access_token)=)[^&\s\"'#]*", re.IGNORECASE)
REDACTED = r"\1***"
#: The loggers uvicorn writes request lines to.
LOGGERS = ("uvicorn.access", "uvicorn.error")


def redact(text: str) -> str:
    """``text`` with the value of every secret query parameter replaced by ``***``."""
    return SECRET_PARAM.sub(REDACTED, text) if "=" in text else text


class RedactSecrets(logging.Filter):
    """A logging filter that redacts secret query parameters in a record's
    message and arguments (it never drops a record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


_FILTER = RedactSecrets()


def install() -> None:
    """Put the filter on uvicorn's loggers (once per process, however many servers it runs)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
