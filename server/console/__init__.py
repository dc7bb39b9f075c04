"""The web console's files: ``static/`` (the page, its ES modules and styles) and
``static/vendor/`` (third-party files pinned by ``package-lock.json``, refreshed
and checked by :mod:`server.console.vendor`). No Python runs here at serve time:
``server/api/console.py`` serves these files, and the console reads the REST and
WebSocket API like any other client."""
