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
])
def test_environment_values_are_read_by_the_type_of_their_setting(monkeypatch, name, raw, expected):
    monkeypatch.setenv("CAYUGA_" + name, raw)
    assert getattr(load_settings(), name.lower()) == expected
