"""Settings: config.yaml, overridden by CAYUGA_* environment variables, validated."""

from __future__ import annotations

import pytest

from server.config import ConfigError, load_settings


def test_bundled_config_declares_stock():
    s = load_settings()
    assert [str(x) for x in s.stream_schemas()] == ["Stock(Name string, Price float, Volume int)"]
    assert s.time_unit_ms == 1.0


def test_environment_overrides_the_file(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("time_unit_ms: 1\nstreams:\n  Temp:\n    Room: string\n    Celsius: float\n")
    monkeypatch.setenv("CAYUGA_TIME_UNIT_MS", "1000")
    s = load_settings(cfg)
    assert s.time_unit_ms == 1000.0
    assert [str(x) for x in s.stream_schemas()] == ["Temp(Room string, Celsius float)"]


@pytest.mark.parametrize("text, fragment", [
    ("time_unit_ms: 0\n", "time_unit_ms: Value error, must be a positive number of milliseconds"),
    ("streams:\n  S:\n    a: integr\n", "stream S, attribute a: unknown attribute type 'integr'"),
    ("tcp_prot: 5\n", "tcp_prot: Extra inputs are not permitted"),
    ("- a\n- b\n", "the top level must be a mapping"),
    ("a: [\n", "not valid YAML"),
])
def test_bad_settings_are_reported_precisely(tmp_path, text, fragment):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert fragment in str(info.value)
    assert str(cfg) in str(info.value)


def test_missing_bundled_defaults_fail_loudly(monkeypatch, tmp_path):
    """An installation without its server/config.yaml must not run on empty
    defaults (no streams: every README query refused as 'unknown stream')."""
    import server.config as config

    monkeypatch.setattr(config, "DEFAULT_CONFIG", tmp_path / "gone" / "config.yaml")
    with pytest.raises(config.ConfigError, match="bundled default configuration .* is missing"):
        config.load_settings()


@pytest.mark.parametrize("name, raw, expected", [
    ("HOST", "::", "::"),  # YAML read it as a mapping: "host: Input should be a valid string"
    ("HOST", "0.0.0.0", "0.0.0.0"),
    ("AUTH_TOKENS", "[0123]", ["0123"]),  # YAML read 0123 as a number: refused
    ("AUTH_TOKENS", '["s3cr3t", "0123", "a,b"]', ["s3cr3t", "0123", "a,b"]),
    ("AUTH_TOKENS", "[a, b]", ["a", "b"]),
    ("AUTH_TOKENS", "yes", ["yes"]),  # one bare token, not the boolean true
    ("DURABILITY", "off", "off"),
    ("DELAY", "250", 250.0),
    ("LOG_LEVEL", "debug", "debug"),
    ("TLS_CERTFILE", "/etc/cayuga/cert.pem", __import__("pathlib").Path("/etc/cayuga/cert.pem")),
    ("TLS_CLIENT_CA", "", None),  # empty: not set
])
def test_environment_values_are_read_by_the_type_of_their_setting(monkeypatch, name, raw, expected):
    monkeypatch.setenv("CAYUGA_" + name, raw)
    assert getattr(load_settings(), name.lower()) == expected


def test_tokens_with_scopes_from_the_environment_and_plain_ones_beside_them(monkeypatch):
    from server.security.tokens import TokenTable

    monkeypatch.setenv("CAYUGA_AUTH_TOKENS", '[{"name": "dashboard", "token": "d4sh", "scopes": ["watch"]}, '
                                             '"0ld-plain", {"name": "team-a", "token": "t3am", "scopes": '
                                             '["manage", "watch"], "prefixes": ["a_"]}]')
    table = TokenTable(load_settings().auth_tokens)
    dash, plain, team = (table.identify(t) for t in ("d4sh", "0ld-plain", "t3am"))
    assert (dash.name, sorted(dash.scopes), dash.allows("manage")) == ("dashboard", ["watch"], False)
    assert (plain.name, plain.allows("manage"), plain.allows("metrics")) == ("auth_tokens[1]", True, True)  # admin
    assert team.restricted and team.reaches("a_x", None) and not team.reaches("b_x", "team-a")
    assert table.identify("d4sh ") is None and table.identify("nope") is None


@pytest.mark.parametrize("tokens, fragment", [
    ('[{"name": "d", "token": "x", "scopes": ["wach"]}]', "auth_tokens[0] (d): scopes.0: Input should be 'ingest'"),
    ('[{"name": "d", "token": "x"}]', "auth_tokens[0] (d): scopes: Field required"),
    ('[{"name": "d", "token": "x", "scopes": ["admin"], "own": true}]', "an admin token reaches every subscription"),
    ('[{"name": "d", "token": "x", "scopes": ["watch"]}, {"name": "d", "token": "y", "scopes": ["watch"]}]',
     "two tokens are named d"),
    ('["same", {"name": "d", "token": "same", "scopes": ["watch"]}]', "d has the same secret as an earlier token"),
    ('[{"name": "has space", "token": "x", "scopes": ["watch"]}]', "a name is 1-64 characters"),
    ('[{"name": "d", "token": "x", "scopes": ["watch"], "prefixes": ["a."]}]',
     "the prefix of token d 'a.' has the character '.'; a name is 1 to 200 letters, digits and underscores"),
    ('[{"name": "d", "token": "x", "scopes": ["watch"], "prefixes": [""]}]', "an empty prefix would match every"),
])
def test_bad_tokens_are_reported_precisely_and_never_show_a_secret(monkeypatch, tokens, fragment):
    monkeypatch.setenv("CAYUGA_AUTH_TOKENS", tokens)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert fragment in str(info.value)
    assert '"x"' not in str(info.value) and "'same'" not in str(info.value)


def test_a_number_for_a_token_is_refused_without_showing_it(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("auth_tokens: [83215]\n")  # YAML reads an unquoted 83215 as a number
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert "auth_tokens[0] is not a string (YAML read it as int" in str(info.value)
    assert "83215" not in str(info.value)


def test_tls_settings_need_a_certificate(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tls_client_ca: /etc/ca.pem\n")
    with pytest.raises(ConfigError, match="tls_client_ca is set but tls_certfile is not"):
        load_settings(cfg)
