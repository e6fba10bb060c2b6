"""No parser of the project takes an abbreviated long option (issue 32 item 11):
``inbox console --token XXX`` was read as ``--token-file XXX``. Every parser of the
commands is walked (subcommands included), and every parser built anywhere in the
repository's Python is checked in its source; ``inbox console --token`` names where a token
does come from."""

from __future__ import annotations

import argparse
import ast
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from inbox.admin import admin_main
from inbox.admin._parser import command_parsers
from inbox.broker.cli import _worker_parser
from inbox.console._command import SECRETS_LINE
from inbox.outbox.relay.cli import _relay_parser
from inbox.retention.cli import _cleanup_parser

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("inbox", "tools", "benchmarks", "examples", "tests")


def walked(
    parser: argparse.ArgumentParser, name: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``parser`` and every subcommand's parser under it, by command line."""
    yield name, parser
    for action in parser._actions:  # argparse keeps subparsers nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                yield from walked(child, f"{name} {sub}")


def every_command_parser() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield from walked(command_parsers()["inbox"], "inbox")
    yield from walked(_worker_parser(), "inbox-worker")
    yield from walked(_relay_parser(), "inbox-relay")
    yield from walked(_cleanup_parser(), "inbox-cleanup")


def test_no_command_parser_takes_abbreviations() -> None:
    names = []
    for name, parser in every_command_parser():
        assert parser.allow_abbrev is False, name
        names.append(name)
    assert {"inbox console", "inbox dlq replay", "inbox-worker", "inbox-cleanup"} <= set(names)


def parser_calls() -> Iterator[tuple[str, ast.Call]]:
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    func = node.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    if name in {"ArgumentParser", "add_subparsers"}:
                        yield f"{path.relative_to(ROOT)}:{node.lineno}", node


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def test_every_parser_in_the_repository_refuses_abbreviations() -> None:
    seen = 0
    for where, call in parser_calls():
        seen += 1
        func = call.func
        if (isinstance(func, ast.Attribute) and func.attr == "add_subparsers") or (
            isinstance(func, ast.Name) and func.id == "add_subparsers"
        ):
            # a subcommand's parser is made by the parser_class: UsageParser refuses them
            given = keyword(call, "parser_class")
            assert isinstance(given, ast.Name), where
            assert given.id == "UsageParser", where
            continue
        allow = keyword(call, "allow_abbrev")
        assert isinstance(allow, ast.Constant), where
        assert allow.value is False, where
    assert seen > 20  # the tools, benchmarks and examples were read


@pytest.mark.parametrize("option", ["--token", "--password"])
def test_a_secret_on_the_command_line_is_refused_with_where_it_comes_from(option: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = admin_main(
        ["console", "--database-url", "sqlite://", option, "s3cret-on-the-command-line"],
        stdout=out,
        stderr=err,
    )
    assert code == 2
    line = err.getvalue()
    assert f"{option} is not an option. The token comes only from $INBOX_CONSOLE_TOKEN" in line
    assert "--token-file FILE" in line
    assert "cannot read the token file" not in line  # never taken for --token-file
    assert "s3cret-on-the-command-line" not in line


def test_abbreviations_are_unknown_options() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = admin_main(
        ["dlq", "replay", "--queue", "q", "--lim", "2", "--broker", "amqp://x"],
        stdout=out,
        stderr=err,
    )
    assert code == 2
    assert "unrecognized arguments: --lim 2" in err.getvalue()


def test_the_consoles_help_says_where_its_secrets_come_from() -> None:
    shown = " ".join(command_parsers()["inbox console"].format_help().split())
    assert SECRETS_LINE in shown
