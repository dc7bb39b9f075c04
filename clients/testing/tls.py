"""TLS certificates for tests and benchmarks, made on the spot with ``trustme``
(the test extra): a CA, a server certificate for 127.0.0.1 and localhost
signed by it, and a second CA with a client certificate for mutual TLS. No
key is ever committed: each test makes its own, in its own directory.

>>> files = make_tls_files(tmp_path)                                   # doctest: +SKIP
>>> with running_server(tmp_path / "data", **files.settings()) as srv:   # doctest: +SKIP
...     CayugaClient(srv.base_url, cacert=str(files.ca)).health()
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

#: The names the server certificate is issued for (what tests connect to).
HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class TlsFiles:
    """PEM files in one directory."""

    ca: Path  #: the CA that signed the server's certificate: clients' --cacert
    cert: Path  #: the server's certificate: tls_certfile
    key: Path  #: its key: tls_keyfile
    client_ca: Path  #: the CA that signs client certificates: tls_client_ca
    client_cert: Path  #: a client certificate it signed: clients' --cert
    client_key: Path  #: its key: clients' --key

    def settings(self, mutual: bool = False) -> dict:
        """Setting overrides for :func:`clients.testing.running_server`."""
        return {"tls_certfile": self.cert, "tls_keyfile": self.key,
                **({"tls_client_ca": self.client_ca} if mutual else {})}

    def env(self, mutual: bool = False) -> dict[str, str]:
        """The same as ``CAYUGA_*`` variables, for ``cayuga serve`` (:class:`clients.testing.ServerProcess`)."""
        return {f"CAYUGA_{k.upper()}": str(v) for k, v in self.settings(mutual).items()}

    def client_args(self, mutual: bool = False) -> list[str]:
        """``--cacert`` (and ``--cert``/``--key``) for a ``cayuga`` client command."""
        return ["--cacert", str(self.ca)] + (["--cert", str(self.client_cert), "--key", str(self.client_key)]
                                             if mutual else [])


def make_tls_files(directory: str | Path, *, hosts=HOSTS, expired: bool = False, prefix: str = "") -> TlsFiles:
    """Make the CAs and certificates in ``directory``; ``expired``: a server
    certificate that expired yesterday. Needs ``trustme`` (pip install
    'cayuga[test]'). ``prefix`` names the files, to make a second set beside."""
    try:
        import trustme
    except ImportError:
        raise RuntimeError("making test certificates needs trustme: pip install 'cayuga[test]' (or trustme)") from None
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca, client_ca = trustme.CA(), trustme.CA()
    now = datetime.datetime.now(datetime.timezone.utc)
    span = ({"not_before": now - datetime.timedelta(days=30), "not_after": now - datetime.timedelta(days=1)}
            if expired else {})
    server = ca.issue_cert(*hosts, **span)
    client = client_ca.issue_cert("cayuga-client@example.org")
    files = TlsFiles(*(d / f"{prefix}{n}.pem" for n in ("ca", "cert", "key", "client-ca", "client-cert",
                                                         "client-key")))
    ca.cert_pem.write_to_path(files.ca)
    server.private_key_pem.write_to_path(files.key)
    files.cert.write_bytes(b"".join(p.bytes() for p in server.cert_chain_pems))
    client_ca.cert_pem.write_to_path(files.client_ca)
    client.private_key_pem.write_to_path(files.client_key)
    files.client_cert.write_bytes(b"".join(p.bytes() for p in client.cert_chain_pems))
    for p in (files.key, files.client_key):
        p.chmod(0o600)
    return files
