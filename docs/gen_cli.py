"""Write the CLI reference (reference/cli.md) from the ``unilog`` command's own argparse parsers, at build time.

Run by the mkdocs-gen-files plugin (mkdocs.yml): every command and sub-command, with its usage and its arguments,
so the page cannot drift from the code. tests/test_docs.py checks that every sub-command is on the page.
"""

from __future__ import annotations

import argparse
import html
import re
from collections.abc import Iterator

import mkdocs_gen_files

from unilog.cli import _parser

PAGE = "reference/cli.md"
WIDTH = 76  # usage lines are wrapped to fit the page, not to the width of the terminal that builds the docs


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each direct sub-command of ``parser``, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def text(value: str) -> str:
    """Help text as inline Markdown: HTML and Markdown's own characters escaped."""
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", html.escape(" ".join(value.split()), quote=False))


def arguments(parser: argparse.ArgumentParser) -> list[str]:
    """A table of ``parser``'s arguments (sub-command choices excluded: they get sections of their own)."""
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    rows = []
    for action in parser._actions:
        skip = (argparse._SubParsersAction, argparse._HelpAction)  # -h/--help: on every command, said once
        if isinstance(action, skip) or action.help == argparse.SUPPRESS:
            continue
        invocation = formatter._format_action_invocation(action)
        help_ = formatter._expand_help(action) if action.help else ""
        rows.append(f"| `{invocation}` | {text(help_)} |")
    return ["| argument | meaning |", "|---|---|", *rows] if rows else []


def section(parser: argparse.ArgumentParser, help_: str, depth: int) -> Iterator[str]:
    """The Markdown for ``parser`` and, below it, each of its sub-commands."""
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=WIDTH)
    yield f"{'#' * min(depth, 6)} `{parser.prog}`"
    yield ""
    description = parser.description or ""
    if description and help_.lower().rstrip(".") in description.lower():
        help_ = ""  # the description says it, and more
    for paragraph in (help_, description):
        if paragraph:
            yield from (text(paragraph[0].upper() + paragraph[1:]), "")
    yield from ("```text", parser.format_usage().strip(), "```", "")
    table = arguments(parser)
    if table:
        yield from (*table, "")
    for _name, sub_help, sub in subcommands(parser):
        yield from section(sub, sub_help, depth + 1)


def page() -> str:
    top = _parser()
    lines = [
        "# Command line",
        "",
        "Generated from the `unilog` command's own parsers when the site is built: `--help` (or `-h`) on any command",
        "prints the same. A command that fails prints one line on stderr and ends with a named exit code (see",
        "[Operations: when something refuses](../guides/operations.md#operations-when-something-refuses)).",
        "",
        *(f"* [`unilog {name}`](#unilog-{name}): {text(help_)}" for name, help_, _ in subcommands(top)),
        "",
        *section(top, "", 2),
    ]
    return "\n".join(lines)


with mkdocs_gen_files.open(PAGE, "w") as out:
    out.write(page())
