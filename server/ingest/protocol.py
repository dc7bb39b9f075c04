"""The TCP event protocol's vocabulary, shared by the receiver
(:mod:`server.ingest.tcp`) and the clients that speak it (``cayuga send``).

The protocol itself -- header lines, formats, acknowledgements, the replies
to a bad line -- is docs/protocol.md."""

from __future__ import annotations

import re

#: A sender id (``#sender <id>``).
SENDER_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: The header lines a connection may start with (after ``#token``).
HEADERS = (b"#format", b"#sender", b"#ack", b"#from")
