"""What a newcomer reads first (issue 23): every option of every command has
help, ``cayuga serve --help`` names every setting and its variable, counts
read right ("1 witness"), and ``cayuga spark ...`` without pyspark says what
to install instead of a traceback. Real ``cayuga`` subprocesses."""

from __future__ import annotations

import subprocess
import sys

import click

from clients.cli import main
from server.config import Settings
from tests.conftest import ROOT


def cayuga(*args, env=None, prelude: str = "pass"):
    """``cayuga ARGS`` as a process; ``prelude`` is Python run before the command line starts."""
    code = f"import sys; {prelude}; from clients.cli import main; sys.argv[0] = 'cayuga'; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=env)


def _commands(cmd: click.Command, path: tuple[str, ...]):
    yield path, cmd
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd, info_name=path[-1])
        for name in cmd.list_commands(ctx):
            yield from _commands(cmd.get_command(ctx, name), (*path, name))


def test_every_option_of_every_command_has_help():
    commands = dict(_commands(main, ("cayuga",)))
    assert {("cayuga", "spark", "source"), ("cayuga", "spark", "sink"), ("cayuga", "serve"),
            ("cayuga", "bench", "rise")} <= set(commands)  # the walk reaches the nested and lazy groups
    missing = [f"{' '.join(path)} {'/'.join(p.opts)}" for path, cmd in commands.items() for p in cmd.params
               if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
    assert missing == []
    no_doc = [" ".join(path) for path, cmd in commands.items() if not (cmd.help or "").strip()]
    assert no_doc == []


def test_serve_help_lists_every_setting_with_its_variable_and_what_the_data_dir_holds():
    r = cayuga("serve", "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())  # click wraps lines
    for name in Settings.model_fields:
        assert f"CAYUGA_{name.upper()} {name} " in text, name
    for part in ("journal/", "witnesses/", "snapshots/", "cayuga.sqlite3"):
        assert part in text.split("Settings:")[0], part  # in --data-dir's own help
    assert "CAYUGA_URL" in text


def test_serve_help_shows_a_variable_set_in_the_environment_but_never_a_token():
    import os

    env = dict(os.environ, CAYUGA_HTTP_PORT="9123", CAYUGA_AUTH_TOKENS="[s3cret]")
    r = cayuga("serve", "--help", env=env)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "http_port (bundled: 8400; set here: 9123)" in text
    assert "auth_tokens (bundled: none; set here)" in text and "s3cret" not in text


def test_counts_are_singular_for_one():
    r = cayuga("run", "--stream", "Stock(Name string, Price float, Volume int)", "--query",
               "examples/example9.xml", "--events", "examples/example9.jsonl")
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "cayuga: 6 events, 1 witness, 0 rejected lines"


def test_plural_words():
    from clients.words import noun, plural

    assert [plural(n, "witness") for n in (0, 1, 2)] == ["0 witnesses", "1 witness", "2 witnesses"]
    assert plural(1, "query") == "1 query" and plural(2, "query") == "2 queries"
    assert plural(1, "rejected line") == "1 rejected line" and noun(3, "record") == "records"


def test_spark_commands_without_pyspark_say_what_to_install(tmp_path):
    """pyspark made unimportable in the process, as in a plain `pip install -e .`."""
    q = tmp_path / "q.cel"
    q.write_text("SELECT * FROM Stock PUBLISH Out")
    runs = {
        "run": ["spark", "run", "--stream", "Stock(Name string)", "--query", str(q), "--input", str(q),
                "--output", str(tmp_path / "o")],
        "source": ["spark", "source", "--stream", "Stock(Name string)", str(q)],
        "sink": ["spark", "sink", "s1", "--output", str(tmp_path / "o")],
        "bench": ["spark", "bench"],
    }
    for what, args in runs.items():
        r = cayuga(*args, prelude="sys.modules['pyspark'] = None")
        assert r.returncode == 2, (what, r.stderr)
        assert "Traceback" not in r.stderr, (what, r.stderr)
        assert r.stderr.strip() == ("cayuga spark: the Spark connector needs pyspark, which is not installed here "
                                    "(the server does not need it, so a plain `pip install cayuga` leaves it out): "
                                    "pip install 'cayuga[spark]' (from a clone: pip install -e '.[spark]'); Spark "
                                    "also needs Java 17 or later (java -version)"), what
    r = cayuga("spark", "run", "--help", prelude="sys.modules['pyspark'] = None")
    assert r.returncode == 0 and "--input-format" in r.stdout, r.stderr  # help needs no Spark
