"""air/names.py: the one rule for stream, attribute and node names."""

from __future__ import annotations

import doctest
import re

import pytest

import air.names
from air.names import (IDENTIFIER_PATTERN, IDENTIFIER_RULE, MAX_NAME_LENGTH, NAME_PATTERN, NAME_RULE,
                       name_problem)


def test_the_docstring_examples():
    assert doctest.testmod(air.names).failed == 0


@pytest.mark.parametrize("name", ["Stock", "_x", "Price_1_1", "a" * MAX_NAME_LENGTH])
def test_valid_names_and_identifiers(name):
    assert name_problem(name) is None and name_problem(name, identifier=True) is None
    assert re.match(NAME_PATTERN, name) and re.match(IDENTIFIER_PATTERN, name)


def test_a_name_may_start_with_a_digit_an_identifier_may_not():
    assert name_problem("94") is None and re.match(NAME_PATTERN, "94")
    assert "starts with a digit" in name_problem("94", identifier=True) and not re.match(IDENTIFIER_PATTERN, "94")


@pytest.mark.parametrize("name, what", [("", "is empty"), ("a" * (MAX_NAME_LENGTH + 1), "is too long"),
                                        ("a/b", "'/'"), ("..", "'.'"), ("a\nb", "'\\n'"), ("é", "'é'")])
def test_each_problem_is_named_with_the_rule(name, what):
    for identifier, rule in ((False, NAME_RULE), (True, IDENTIFIER_RULE)):
        problem = name_problem(name, what="stream name", identifier=identifier)
        assert what in problem and problem.endswith(rule) and problem.startswith("the stream name")
        assert not re.match(NAME_PATTERN, name) and not re.match(IDENTIFIER_PATTERN, name)


def test_a_long_name_is_not_echoed_whole():
    assert name_problem("x" * 10_000).count("x") < 60
