"""A pickle machine of blobtool's own: what a state dict's pickle builds, with nothing of it run, hashed or changed.

pickle.Unpickler with a find_class allowlist is the usual way to read such a
pickle; blobtool does not use it, for what it does with what it allows
(each measured on crafted checkpoints of a few hundred bytes):

- BUILD calls ``__setstate__`` of whatever object is on the stack, the
  checked records a rebuild returned included: a tensor's offset, size and
  stride were replaced after their check, and its values read from outside
  the file's mapping;
- its memo is an array indexed by the slot a PUT names: storing into slot
  2**26 allocated 1.08 GB (doubling the slot doubles it);
- dict keys and set items are hashed as they are stored: a 300,000-deep
  tuple used as a key overflowed the C stack while being hashed (SIGSEGV),
  and 20,000 integer keys that all hash to 0 took 5 s (60,000: over 60 s).

This machine runs the opcodes pickletools.genops decodes, one at a time, on
objects of its own:

- a dict, an OrderedDict, a list, a set, a frozenset and a tuple are
  PickledDict, PickledList, PickledSet and PickledTuple: their items in the
  order the pickle gave them, never hashed (a dict's keys are compared only
  where blobtool looks one up, as str keys of a Python dict it builds then,
  whose hashes Python randomizes);
- strings, bytes, numbers, True, False and None are Python's own values;
- a GLOBAL (or STACK_GLOBAL) must name one of `callables`, the objects the
  caller allows; REDUCE calls only those, with the arguments the pickle
  gives (the caller's functions check them); BINPERSID calls `persistent`;
- a container is changed only while it is being built: once it is placed
  in another container or handed to a call, SETITEM, APPEND, ADDITEMS and
  BUILD onto it are refused, and they are refused outright onto anything
  the caller's functions returned but the containers they make (an
  OrderedDict() being filled). So no value is changed after it was
  checked, no container holds itself (a cycle needs a placed container
  changed), and each container's nesting depth is known when it is made:
  more than MAX_NESTING is refused;
- BUILD is taken only on an OrderedDict (torch's state dicts carry their
  ``_metadata`` that way): the attributes are kept in the dict's
  ``attributes``, nothing else is done with them;
- the memo is a dict from slot to value: its memory follows what is stored.

Opcodes that make objects by other means (INST, OBJ, NEWOBJ, NEWOBJ_EX,
extension codes, text persistent ids, out-of-band buffers) are refused, and
so is any opcode this module does not know. The caller bounds the pickle's
size and opcode count: every opcode makes at most one object, so both bound
the memory and time a pickle can take.
"""

from __future__ import annotations

import pickletools
import struct
import warnings
from typing import Callable

from ..errors import BlobToolError

__all__ = ["PickledDict", "PickledList", "PickledSet", "PickledTuple", "Global", "run_pickle", "shown",
           "MAX_NESTING", "REFUSED_OPCODES"]

# How deep containers may nest. A checkpoint nests a state dict three or four
# deep ({"model": {"state_dict": {...}}}), an optimizer's state six; nothing
# blobtool reads comes near this, and nothing it does recurses deeper.
MAX_NESTING = 64
# Opcodes that make objects other than through the caller's callables, or
# read persistent ids as text: a state dict's pickle has none.
REFUSED_OPCODES = frozenset({"INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4", "PERSID",
                             "NEXT_BUFFER", "READONLY_BUFFER"})


class _Container:
    # depth: how deep containers nest in it (1: it holds none); placed: put
    # in another object or handed to a call, and so never changed again.
    # Each class sets both in its own __init__ (a pickle can make one per opcode).
    __slots__ = ("depth", "placed")


class PickledDict(_Container):
    """A dict (or OrderedDict) as the pickle built it: (key, value) pairs in order, duplicates kept."""

    __slots__ = ("pairs", "ordered", "attributes")

    def __init__(self, ordered: bool = False):
        self.depth, self.placed = 1, False
        self.pairs: list | tuple = ()  # a list once filled: an empty one costs 56 bytes more a dict
        self.ordered = ordered
        self.attributes = None

    def keys(self) -> list:
        return [k for k, _ in self.pairs]


class PickledList(_Container):
    """A list as the pickle built it."""

    __slots__ = ("items",)

    def __init__(self):
        self.depth, self.placed = 1, False
        self.items: list | tuple = ()  # a list once filled


class PickledSet(_Container):
    """A set or frozenset as the pickle built it: its items in order, duplicates kept."""

    __slots__ = ("items", "frozen")

    def __init__(self, frozen: bool = False):
        self.depth, self.placed = 1, False
        self.items: list | tuple = ()  # a list once filled
        self.frozen = frozen


class PickledTuple(_Container):
    """A tuple as the pickle built it."""

    __slots__ = ("items",)

    def __init__(self, items: tuple):
        self.depth, self.placed = 1, False
        self.items = items


_KIND = {PickledDict: "a dict", PickledList: "a list", PickledSet: "a set", PickledTuple: "a tuple"}


class Global:
    """What a GLOBAL opcode pushed: the object the caller allows for that module and name."""

    __slots__ = ("module", "name", "target")

    def __init__(self, module: str, name: str, target):
        self.module, self.name, self.target = module, name, target


def shown(value, depth: int = 0) -> str:
    """A short text for a value in an error line, whatever its size (a huge int or string, a deep tuple)."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        text = repr(value)
    elif isinstance(value, int):
        text = repr(value) if value.bit_length() <= 64 else f"<an integer of {value.bit_length()} bits>"
    elif isinstance(value, (str, bytes)):
        text = repr(value[:80])
    elif isinstance(value, PickledTuple):
        if depth >= 2:
            return "(...)"
        inner = ", ".join(shown(v, depth + 1) for v in value.items[:8]) + (", ..." if len(value.items) > 8 else "")
        text = f"({inner}{',' if len(value.items) == 1 else ''})"
    else:
        text = _KIND.get(type(value)) or type(value).__name__.lstrip("_")
    return text if len(text) <= 80 else text[:77] + "..."


def _grown(items):
    """`items` as a list that can grow (containers start with the empty tuple)."""
    return items if type(items) is list else list(items)


def _depth(value) -> int:
    return value.depth if isinstance(value, _Container) else 0


class _Machine:
    def __init__(self, callables: dict, persistent: Callable, refuse: Callable[[str], BlobToolError]):
        self.callables = callables
        self.persistent = persistent
        self.refuse = refuse
        self.stack: list = []
        self.marks: list = []
        self.memo: dict = {}

    # -- what containers may hold --------------------------------------------------------

    def place(self, value, into: _Container, pos: int):
        """Put `value` into `into` (its depth grows to hold it); a container placed is never changed again."""
        if value is into:
            raise self.refuse(f"puts {_KIND[type(into)]} into itself at byte {pos}; a state dict holds no cycle")
        depth = _depth(value) + 1
        if depth > MAX_NESTING:
            raise self.refuse(f"nests containers more than {MAX_NESTING} deep at byte {pos} (blobtool's limit)")
        if depth > into.depth:
            into.depth = depth
        if isinstance(value, _Container):
            value.placed = True
        return value

    def target(self, kind: type, opcode: str, pos: int):
        """The container an opcode changes: of `kind`, and still being built."""
        obj = self.stack[-1] if self.stack else None
        if type(obj) is not kind or (kind is PickledSet and obj.frozen):
            raise self.refuse(f"uses {opcode} at byte {pos} on {shown(obj)}; a state dict's pickle uses it only "
                              f"on {_KIND[kind]} it is building")
        if obj.placed:
            raise self.refuse(f"uses {opcode} at byte {pos} to change {_KIND[kind]} after it was placed in "
                              "another object or handed to a call; a state dict's pickle fills each one first")
        return obj

    def pop_mark(self, pos: int) -> list:
        if not self.marks:
            raise self.refuse(f"takes items up to a MARK at byte {pos}, with no MARK before it")
        at = self.marks.pop()
        items = self.stack[at:]
        del self.stack[at:]
        return items

    def pop(self, pos: int, count: int = 1) -> list:
        floor = self.marks[-1] if self.marks else 0
        if len(self.stack) - floor < count:
            raise self.refuse(f"takes {count} item{'s' * (count != 1)} at byte {pos} from a stack holding "
                              f"{len(self.stack) - floor}")
        items = self.stack[len(self.stack) - count:]
        del self.stack[len(self.stack) - count:]
        return items

    def tuple_of(self, items, pos: int) -> PickledTuple:
        made = PickledTuple(tuple(items))
        for item in made.items:
            self.place(item, made, pos)
        return made

    def call(self, fn, args, pos: int):
        if not isinstance(fn, Global) or not callable(fn.target):
            raise self.refuse(f"calls {shown(fn)} at byte {pos}; a state dict's pickle calls only the rebuilds "
                              "of its tensors and OrderedDict")
        if not isinstance(args, PickledTuple):
            raise self.refuse(f"calls {fn.module}.{fn.name} at byte {pos} with {shown(args)} as its arguments, "
                              "not a tuple")
        args.placed = True
        return fn.target(*args.items)

    # -- the opcodes ---------------------------------------------------------------------

    def run(self, data: bytes, max_opcodes: int):
        steps = {name[3:]: getattr(self, name) for name in dir(type(self)) if name.startswith("op_")}
        for count, (opcode, arg, pos) in enumerate(pickletools.genops(data), 1):
            if count > max_opcodes:
                raise self.refuse(f"holds more than {max_opcodes} pickle opcodes (blobtool's limit)")
            name = opcode.name
            step = steps.get(name)
            if name == "STOP":  # as pickle does, the top of the stack is the value; the rest is dropped
                if not self.stack:
                    raise self.refuse(f"ends at byte {pos} with nothing on its stack")
                return self.stack[-1]
            if name in REFUSED_OPCODES or step is None:
                raise self.refuse(f"uses the pickle opcode {name} at byte {pos}, which builds objects a state dict "
                                  "does not hold; blobtool never runs it")
            step(arg, pos)
        raise self.refuse("ends without STOP")

    def op_PROTO(self, arg, pos):
        pass

    def op_FRAME(self, arg, pos):
        pass

    def push_value(self, arg, pos):
        self.stack.append(arg)

    # INT included: protocol 0 writes True and False as INT "01" and "00", which genops gives as bools.
    op_INT = op_BININT = op_BININT1 = op_BININT2 = op_LONG = op_LONG1 = op_LONG4 = push_value
    op_BINFLOAT = op_FLOAT = push_value
    op_UNICODE = op_BINUNICODE = op_SHORT_BINUNICODE = op_BINUNICODE8 = push_value

    def push_bytes(self, arg, pos):
        self.stack.append(bytes(arg))

    op_BINBYTES = op_SHORT_BINBYTES = op_BINBYTES8 = op_BYTEARRAY8 = push_bytes

    def push_py2_string(self, arg, pos):
        # Python 2's str reads as text, as pickle's default encoding "ASCII" reads it; other bytes are refused.
        text = arg if isinstance(arg, str) else bytes(arg)
        if isinstance(text, bytes):
            try:
                text = text.decode("ascii")
            except UnicodeDecodeError:
                raise self.refuse(f"holds a Python 2 string that is not ASCII at byte {pos}") from None
        self.stack.append(text)

    op_STRING = op_BINSTRING = op_SHORT_BINSTRING = push_py2_string

    def op_NONE(self, arg, pos):
        self.stack.append(None)

    def op_NEWTRUE(self, arg, pos):
        self.stack.append(True)

    def op_NEWFALSE(self, arg, pos):
        self.stack.append(False)

    def op_EMPTY_DICT(self, arg, pos):
        self.stack.append(PickledDict())

    def op_EMPTY_LIST(self, arg, pos):
        self.stack.append(PickledList())

    def op_EMPTY_SET(self, arg, pos):
        self.stack.append(PickledSet())

    def op_EMPTY_TUPLE(self, arg, pos):
        self.stack.append(PickledTuple(()))

    def op_MARK(self, arg, pos):
        self.marks.append(len(self.stack))

    def op_TUPLE(self, arg, pos):
        self.stack.append(self.tuple_of(self.pop_mark(pos), pos))

    def op_TUPLE1(self, arg, pos):
        self.stack.append(self.tuple_of(self.pop(pos, 1), pos))

    def op_TUPLE2(self, arg, pos):
        self.stack.append(self.tuple_of(self.pop(pos, 2), pos))

    def op_TUPLE3(self, arg, pos):
        self.stack.append(self.tuple_of(self.pop(pos, 3), pos))

    def op_LIST(self, arg, pos):
        made = PickledList()
        made.items = [self.place(item, made, pos) for item in self.pop_mark(pos)]
        self.stack.append(made)

    def op_DICT(self, arg, pos):
        items = self.pop_mark(pos)
        if len(items) % 2:
            raise self.refuse(f"builds a dict at byte {pos} from {len(items)} items, not pairs")
        made = PickledDict()
        self.fill(made, items, pos)
        self.stack.append(made)

    def op_FROZENSET(self, arg, pos):
        made = PickledSet(frozen=True)
        made.items = [self.place(item, made, pos) for item in self.pop_mark(pos)]
        self.stack.append(made)

    def fill(self, into: PickledDict, items: list, pos: int) -> None:
        into.pairs = _grown(into.pairs)
        for i in range(0, len(items), 2):
            into.pairs.append((self.place(items[i], into, pos), self.place(items[i + 1], into, pos)))

    def op_SETITEM(self, arg, pos):
        items = self.pop(pos, 2)
        self.fill(self.target(PickledDict, "SETITEM", pos), items, pos)

    def op_SETITEMS(self, arg, pos):
        items = self.pop_mark(pos)
        if len(items) % 2:
            raise self.refuse(f"gives SETITEMS {len(items)} items at byte {pos}, not pairs")
        self.fill(self.target(PickledDict, "SETITEMS", pos), items, pos)

    def extend(self, kind: type, opcode: str, items: list, pos: int) -> None:
        into = self.target(kind, opcode, pos)
        into.items = _grown(into.items)
        for item in items:
            into.items.append(self.place(item, into, pos))

    def op_APPEND(self, arg, pos):
        self.extend(PickledList, "APPEND", self.pop(pos), pos)

    def op_APPENDS(self, arg, pos):
        self.extend(PickledList, "APPENDS", self.pop_mark(pos), pos)

    def op_ADDITEMS(self, arg, pos):
        self.extend(PickledSet, "ADDITEMS", self.pop_mark(pos), pos)

    def op_POP(self, arg, pos):
        if self.stack and self.marks and self.marks[-1] == len(self.stack):
            self.marks.pop()  # as pickle does: POP of a MARK drops the mark
            return
        self.pop(pos)

    def op_POP_MARK(self, arg, pos):
        self.pop_mark(pos)

    def op_DUP(self, arg, pos):
        self.stack.append(self.pop(pos)[0])
        self.stack.append(self.stack[-1])

    def memo_put(self, index, pos):
        if not self.stack:
            raise self.refuse(f"stores into memo slot {shown(index)} at byte {pos} from an empty stack")
        self.memo[index] = self.stack[-1]

    def op_PUT(self, arg, pos):
        self.memo_put(arg, pos)

    op_BINPUT = op_LONG_BINPUT = op_PUT

    def op_MEMOIZE(self, arg, pos):
        self.memo_put(len(self.memo), pos)

    def op_GET(self, arg, pos):
        if arg not in self.memo:
            raise self.refuse(f"reads memo slot {shown(arg)} at byte {pos}, which holds nothing")
        self.stack.append(self.memo[arg])

    op_BINGET = op_LONG_BINGET = op_GET

    def push_global(self, module, name, pos):
        if not (isinstance(module, str) and isinstance(name, str)):
            raise self.refuse(f"names a global by {shown(module)} and {shown(name)} at byte {pos}, not two strings")
        found = self.callables.get((module, name))
        if found is None:
            raise _NotAllowed(module, name)
        self.stack.append(Global(module, name, found))

    def op_GLOBAL(self, arg, pos):
        module, _, name = str(arg).partition(" ")
        self.push_global(module, name, pos)

    def op_STACK_GLOBAL(self, arg, pos):
        module, name = self.pop(pos, 2)
        self.push_global(module, name, pos)

    def op_REDUCE(self, arg, pos):
        fn, args = self.pop(pos, 2)
        self.stack.append(self.call(fn, args, pos))

    def op_BINPERSID(self, arg, pos):
        pid = self.pop(pos)[0]
        if isinstance(pid, _Container):
            pid.placed = True
        self.stack.append(self.persistent(pid))

    def op_BUILD(self, arg, pos):
        state = self.pop(pos)[0]
        obj = self.stack[-1] if self.stack else None
        if not (type(obj) is PickledDict and obj.ordered):
            raise self.refuse(f"uses BUILD at byte {pos} to set the state of {shown(obj)}; a state dict's pickle "
                              "sets attributes only on an OrderedDict")
        obj = self.target(PickledDict, "BUILD", pos)
        if obj.attributes is not None:
            raise self.refuse(f"uses BUILD at byte {pos} to set an OrderedDict's attributes a second time")
        obj.attributes = self.place(state, obj, pos)


class _NotAllowed(Exception):
    def __init__(self, module, name):
        super().__init__(module, name)
        self.module, self.name = module, name


def run_pickle(data: bytes, *, max_opcodes: int, callables: dict, persistent: Callable,
               refuse: Callable[[str], BlobToolError], not_allowed: Callable[[str, str], BlobToolError]):
    """Run the pickle `data` on this module's machine; what it builds (PickledDict ... or a callable's result).

    At most `max_opcodes` opcodes are run.
    `callables` maps (module, name) to what a GLOBAL of that name gives: a
    function REDUCE may call with the pickle's arguments, or a value (a
    storage type) only passed on. `persistent(pid)` gives what BINPERSID
    makes of a persistent id. `refuse(text)` makes the error raised for a
    pickle the machine will not run; `not_allowed(module, name)` the one for
    a global not in `callables`. Errors the callables raise go through.
    """
    machine = _Machine(callables, persistent, refuse)
    try:
        with warnings.catch_warnings():
            # A text string with a bad escape is a DeprecationWarning of the
            # decoder's: here, a damaged pickle, said in the one error line.
            warnings.simplefilter("error")
            return machine.run(data, max_opcodes)
    except _NotAllowed as exc:
        raise not_allowed(exc.module, exc.name) from None
    except BlobToolError:
        raise
    # genops raises these on damaged bytes (a truncated argument, a bad
    # UTF-8 string, an opcode byte it does not know): the file's fault.
    except (ValueError, struct.error, UnicodeDecodeError, TypeError, OverflowError, Warning) as exc:
        raise refuse(f"is not a readable pickle: {exc}") from exc
