"""Shell completion of blob names after --blob, from the input files already on the command line.

click completes commands and options itself (`_BLOBTOOL_COMPLETE=bash_source
blobtool`); this adds the names --blob takes: the blobs and layers of the
files given so far. Only the files' headers are read (open_document reads no
payload), and completion never prints anything but the candidates: a file
that cannot be read gives none.

bash inserts a candidate as it is (click's bash script adds it to COMPREPLY
unquoted), so a name holding characters the shell treats specially
(`conv4_c1x1-w(s/2)__conv/0`, `a b`, `it's`) is offered quoted, as a word
bash reads back as the name; a plain name is offered unchanged. zsh and fish
quote what they insert themselves.
"""

from __future__ import annotations

import os
import shlex

import click
from click.shell_completion import BashComplete, add_completion_class, split_arg_string

from .paths import INPUT

__all__ = ["complete_blob_names", "bash_word", "last_word"]


# What bash treats specially within double quotes (! for history expansion).
_SPECIAL_IN_DOUBLE = set('"$`\\!')
# What a backslash escapes within double quotes.
_ESCAPED_IN_DOUBLE = '$`"\\\n'


def bash_word(value: str) -> str:
    """`value` as one word bash reads back as `value`: unchanged where no character of it is special to the shell.

    Any other is quoted: '...' where it holds no single quote, else "..."
    where that needs no escape, else '...' with each ' written '\\''.
    Control characters (a newline, an escape) are written in bash's $'...'
    form, so that the word stays on one line.
    """
    if not value.isprintable():
        return "$'" + "".join(_ansi_c(char) for char in value) + "'"
    if shlex.quote(value) == value:
        return value
    if "'" in value and not _SPECIAL_IN_DOUBLE & set(value):
        return '"' + value + '"'
    return _quoted(value, "'")


def _quoted(text: str, quote: str) -> str:
    """`text` as bash text that starts with `quote` (', " or $') and reads back as `text`."""
    if quote == "$'":  # the $ stays on the line: readline replaces from the quote after it
        return "'" + "".join(_ansi_c(char) for char in text) + "'"
    if not text.isprintable():  # an empty quoted string, then $'...': one line
        return quote * 2 + "$'" + "".join(_ansi_c(char) for char in text) + "'"
    if quote == "'":
        return "'" + text.replace("'", "'\\''") + "'"
    return '"' + "".join("\\" + char if char in '"$`\\' else "\"'!'\"" if char == "!" else char
                         for char in text) + '"'


def _ansi_c(char: str) -> str:
    """One character inside bash's $'...' quotes."""
    if char in "\\'":
        return "\\" + char
    if char.isprintable():
        return char
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\U{ord(char):08x}"


_ANSI_C = {"n": "\n", "t": "\t", "r": "\r", "e": "\x1b", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def last_word(line: str) -> tuple[str, str, str | None]:
    """The last word of a bash command line as bash reads it, while it is still being typed.

    Returns (its text, the text before the quote it leaves open, that quote:
    ', " or $'; None when it leaves none open). Readline completes only what
    follows an open quote, so that is what a candidate replaces.
    """
    text, before, quote = [], "", None
    i = 0
    while i < len(line):
        char, after = line[i], line[i + 1:i + 2]
        step = 1
        if quote is None:
            if char in " \t\n":
                text = []
            elif char == "\\":
                text.append(after)
                step = 2
            elif char in "'\"" or (char == "$" and after == "'"):
                quote = "$'" if char == "$" else char
                before = "".join(text)
                step = len(quote)
            else:
                text.append(char)
        elif char == quote[-1]:  # escapes are taken in pairs below, so this quote is not escaped
            quote = None
        elif quote == '"' and char == "\\" and after and after in _ESCAPED_IN_DOUBLE:
            text.append(after)
            step = 2
        elif quote == "$'" and char == "\\":
            text.append(_ANSI_C.get(after, after))
            step = 2
        else:
            text.append(char)
        i += step
    return "".join(text), before, quote


class QuotingBashComplete(BashComplete):
    """click's bash completion, its candidates quoted as words bash reads back as the names.

    click's script adds each candidate to COMPREPLY as it is, so bash would
    insert `conv4_c1x1-w(s/2)__conv/0` unquoted: a candidate is quoted
    (bash_word) where it needs it. Where the word being completed leaves a
    quote open ('conv4_c), readline replaces only what follows the quote:
    each candidate is then that part, quoted the same way. The word typed so
    far is read as bash reads it (click's split takes "a\\$b" for a\\$b).
    The script reads each line with `read` without -r, which takes a
    backslash as an escape: backslashes are doubled to reach bash.
    """

    before = ""
    quote = None

    def get_completion_args(self) -> tuple[list, str]:
        args, incomplete = super().get_completion_args()
        line = os.environ.get("COMP_WORDS", "")
        if int(os.environ.get("COMP_CWORD", "0")) >= len(split_arg_string(line)) - 1:  # completing the last word
            incomplete, self.before, self.quote = last_word(line)
        return args, incomplete

    def format_completion(self, item) -> str:
        if item.type != "plain":
            return super().format_completion(item)
        value = item.value
        if self.quote is not None and value.startswith(self.before):
            word = _quoted(value[len(self.before):], self.quote)
        else:
            word = bash_word(value)
        return f"{item.type},{word.replace(chr(92), chr(92) * 2)}"


add_completion_class(QuotingBashComplete, "bash")


def _given_inputs(ctx: click.Context) -> list:
    """The input paths given so far, standard input left out.

    They are the command's INPUT arguments once parsed; while an option
    still waits for its value (`--blob` itself), click leaves the positional
    words unparsed in ctx.args.
    """
    words = []
    for param in ctx.command.params:
        if isinstance(param, click.Argument) and param.type is INPUT:
            value = ctx.params.get(param.name)
            words += value if isinstance(value, (list, tuple)) else [value]
    words += [w for w in ctx.args if not w.startswith("-")]
    return list(dict.fromkeys(w for w in words if isinstance(w, str) and w and w != "-"))


def _names(path: str, kind) -> list:
    """The names --blob accepts in this file: its blobs', then its layers' (a layer selects its blobs)."""
    from ..api import open_document

    doc = open_document(path, kind)
    try:
        names = doc.names()
        names += [layer for layer in dict.fromkeys(e.layer for e in doc.entries if e.layer is not None)]
        return names
    finally:
        doc.source.close()


def complete_blob_names(ctx: click.Context, param, incomplete: str) -> list:
    """click's shell_complete for --blob: the names in the given files that start with `incomplete`, in file order."""
    found = {}
    kind = ctx.params.get("kind")
    for path in _given_inputs(ctx):
        if not os.path.isfile(path):
            continue  # a FIFO or device would block or stream: completion reads regular files only
        try:
            names = _names(path, kind)
        except Exception:  # noqa: BLE001 - a completion never fails: an unreadable file offers nothing
            continue
        for name in names:
            if name.startswith(incomplete):
                found.setdefault(name, None)
    return list(found)
