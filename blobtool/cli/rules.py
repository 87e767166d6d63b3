"""Which options apply together, declared once per command (Verb), and the old spellings of options.

A command built with `verb(...)` states, for each option that applies only
with (or never with) another, one rule: `Needs("names", TORCH_NAMES)` says
--no-fold applies only when --names is torch or torch-identifiers;
`Refuses("names", ..., why)` that --layers never goes with --names torch.
Verb checks every rule of every option the user gave (on the command line or
through the environment) before the command runs, and refuses a combination
that does not apply with one line and exit 2: nothing is ignored in silence.
tests/cli/test_verbs.py walks every pair of each command's options against these
declarations.

`moved` holds options that other commands took over: given, the command
says which (exit 2) before parsing anything else. `respelled` holds the
short forms kept from earlier releases (convert --double is --precision
double), rewritten before parsing. `negative_numbers`: a positional argument
may be a negative number (scale FILE -0.5), never read as an option.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import click
from click.core import ParameterSource

__all__ = ["Needs", "Refuses", "Verb", "verb", "GIVEN_SOURCES"]

# Where a value counts as given by the user (a default is not).
GIVEN_SOURCES = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)

_NEGATIVE_NUMBER = re.compile(r"-(\d|\.\d|inf\b|nan\b)", re.IGNORECASE)


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) in GIVEN_SOURCES


def _matches(value, values) -> bool:
    """Whether a parameter's value is one of `values`, or passes it (a callable); any set value when empty."""
    if callable(values):
        return bool(values(value))
    if not values:
        return value not in (None, False, (), "")
    return value in values


def _condition(other: str, values, shown: str) -> str:
    if shown:
        return shown
    return other if not values else " or ".join(f"{other} {v}" for v in values)


@dataclass(frozen=True)
class Needs:
    """The option applies only when parameter `other` has one of `values` (or, with none, is given)."""

    other: str
    values: tuple = ()
    why: str = ""
    shown: str = ""     # how the message names the condition, where `values` is a callable

    def holds(self, ctx: click.Context) -> bool:
        return _matches(ctx.params.get(self.other), self.values)

    def says(self, option: str, other: str) -> str:
        why = f" ({self.why})" if self.why else ""
        return f"{option} applies only with {_condition(other, self.values, self.shown)}{why}"


@dataclass(frozen=True)
class Refuses:
    """The option does not apply when parameter `other` has one of `values` (or, with none, is given)."""

    other: str
    values: tuple = ()
    why: str = ""
    shown: str = ""

    def holds(self, ctx: click.Context) -> bool:
        if not self.values:
            return not _given(ctx, self.other)
        return not _matches(ctx.params.get(self.other), self.values)

    def says(self, option: str, other: str) -> str:
        why = f": {self.why}" if self.why else ""
        return f"{option} does not apply with {_condition(other, self.values, self.shown)}{why}"


@dataclass
class Settings:
    rules: dict = field(default_factory=dict)       # parameter name -> (Needs | Refuses, ...)
    moved: dict = field(default_factory=dict)       # old option -> the line that says where it went
    respelled: dict = field(default_factory=dict)   # old option -> the tokens it stands for
    negative_numbers: bool = False


class Verb(click.Command):
    """A click command with declared option rules, moved options and old spellings (see the module's text)."""

    def __init__(self, *args, rules=None, moved=None, respelled=None, negative_numbers=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings = Settings(dict(rules or {}), dict(moved or {}), dict(respelled or {}), negative_numbers)
        known = {p.name for p in self.params}
        for name, rules_of in self.settings.rules.items():
            for rule in (name, *(r.other for r in rules_of)):
                if rule not in known:
                    raise TypeError(f"{self.name}: a rule names {rule!r}, which is not a parameter")

    def option_of(self, name: str) -> str:
        """How the user spells parameter `name`: its longest option string (its metavar for an argument)."""
        for param in self.params:
            if param.name == name:
                if isinstance(param, click.Option):
                    return max(param.opts, key=len)
                return param.human_readable_name
        raise KeyError(name)

    def parse_args(self, ctx: click.Context, args: list) -> list:
        args = self._respelled(ctx, list(args))
        if self.settings.negative_numbers:
            args = self._numbers_as_arguments(args)
        rest = super().parse_args(ctx, args)
        self.check_rules(ctx)
        return rest

    def _respelled(self, ctx: click.Context, args: list) -> list:
        out: list = []
        for i, token in enumerate(args):
            if token == "--":
                out += args[i:]
                break
            name = token.split("=", 1)[0]
            if name in self.settings.moved and name.startswith("--"):
                raise click.UsageError(self.settings.moved[name], ctx)
            out += list(self.settings.respelled.get(token, (token,)))
        self._one_value_each(ctx, out)
        return out

    def _one_value_each(self, ctx: click.Context, args: list) -> None:
        """Refuse two values for an option that short forms also set (--bf16 --half-strict: two precisions)."""
        targets = {form[0] for form in self.settings.respelled.values()}
        seen: dict = {}
        for i, token in enumerate(args):
            if token == "--":
                break
            name, eq, value = token.partition("=")
            if name in targets:
                value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
                seen.setdefault(name, [])
                if value not in seen[name]:
                    seen[name].append(value)
        for name, values in seen.items():
            if len(values) > 1:
                raise click.UsageError(f"{name} is asked for twice, as {' and as '.join(values)} (with the short "
                                       "forms given): give one", ctx)

    def _numbers_as_arguments(self, args: list) -> list:
        """The positional arguments after '--', in their order, so that a negative number is never an option."""
        takes_value = {opt for p in self.params if isinstance(p, click.Option) and not p.is_flag and not p.count
                       for opt in p.opts + p.secondary_opts}
        options, positionals = [], []
        i = 0
        while i < len(args):
            token = args[i]
            if token == "--":
                positionals += args[i + 1:]
                break
            if token in takes_value:
                options += args[i:i + 2]
                i += 2
                continue
            if token.startswith("-") and token != "-" and not _NEGATIVE_NUMBER.match(token):
                options.append(token)
            else:
                positionals.append(token)
            i += 1
        return options + ["--"] + positionals if positionals else options

    def check_rules(self, ctx: click.Context) -> None:
        """Refuse (exit 2, one line) the first given option whose rules do not hold."""
        for param in self.params:
            rules_of = self.settings.rules.get(param.name, ())
            if not rules_of or not _given(ctx, param.name):
                continue
            for rule in rules_of:
                if not rule.holds(ctx):
                    raise click.UsageError(rule.says(self.option_of(param.name), self.option_of(rule.other)), ctx)


def verb(name: str | None = None, **settings):
    """click.command with cls=Verb: the decorator of every blobtool command."""
    from .group import CONTEXT_SETTINGS

    settings.setdefault("context_settings", CONTEXT_SETTINGS)
    return click.command(name, cls=Verb, **settings)
