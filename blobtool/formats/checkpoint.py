"""Which state dict of a PyTorch checkpoint to read: the search through what its pickle built, and --key.

A checkpoint is a dict of parts by str key ({"state_dict": ..., "epoch": 3,
"optimizer": ...}); the state dict is the one dict of tensors by name among
them, looked for breadth first at most _MAX_DEPTH dicts deep and over at
most _MAX_VISITS items, each dict once. An optimizer's state (a dict with
"state" and "param_groups") is passed over: its per-parameter dicts hold
tensors by name too. Several state dicts are refused unless the read
settings' key names one.
"""

from __future__ import annotations

from ..errors import FormatError, parameter
from . import MAX_BLOBS
from .pickled import PickledDict, shown

__all__ = ["find_state_dict", "indexed", "SAVE_STATE_DICT"]

# How deep into a checkpoint's dicts the state dict is looked for, and how
# many of their items at most are looked at.
_MAX_DEPTH = 4
_MAX_VISITS = 4 * MAX_BLOBS
# What to do instead, said whenever a file is not a state dict blobtool can read.
SAVE_STATE_DICT = "save the weights as a state dict instead: torch.save(model.state_dict(), path)"


def _str_items(node) -> dict:
    """A dict's str keys and values as a Python dict would hold them (the last pair of a key wins); other keys
    are passed over: a checkpoint names its parts by str keys, and only str keys compare exactly without
    hashing what a pickle made (1 == True, NaN != NaN)."""
    if not isinstance(node, PickledDict):
        return {}
    return {k: v for k, v in node.pairs if type(k) is str}


def _tensors_by_name(value, tensor: type) -> dict | None:
    """{name: tensor} when `value` is a state dict (a dict of `tensor`s by str name, not empty), else None."""
    if not isinstance(value, PickledDict) or not value.pairs:
        return None
    if not all(type(k) is str and isinstance(v, tensor) for k, v in value.pairs):
        return None
    return dict(value.pairs)


def _is_optimizer(value) -> bool:
    """An optimizer's state dict (torch.optim.Optimizer.state_dict(): "state" and "param_groups")."""
    return isinstance(value, PickledDict) and {"state", "param_groups"} <= _str_items(value).keys()


def indexed(keys: tuple) -> str:
    """keys as Python indexes them: ['model']['state_dict']."""
    return "".join(f"[{shown(k)}]" for k in keys)


def _state_dicts(obj, tensor: type) -> tuple:
    """([keys leading to each state dict found], [keys of each optimizer state passed over]), breadth first.

    Only str keys are followed. Each dict is looked at once, however many
    keys lead to it (a pickle's memo lets one dict of 100,000 items be the
    value of 30,000 keys).
    """
    found, optimizers, queue, visits, seen = [], [], [((), obj)], 0, {id(obj)}
    while queue and visits < _MAX_VISITS:
        keys, node = queue.pop(0)
        for key, value in _str_items(node).items():
            visits += 1
            if visits > _MAX_VISITS:
                break
            if not isinstance(value, PickledDict) or id(value) in seen:
                continue
            seen.add(id(value))
            if _tensors_by_name(value, tensor) is not None:
                found.append(keys + (key,))
            elif _is_optimizer(value):
                optimizers.append(keys + (key,))
            elif len(keys) + 1 < _MAX_DEPTH:
                queue.append((keys + (key,), value))
    return found, optimizers


def _at(obj, keys: tuple):
    for key in keys:
        obj = _str_items(obj)[key]
    return obj


def _key_text(keys: tuple) -> str | None:
    """keys as --key takes them (joined by "/"), or None where they cannot be typed so."""
    if all(len(k) <= 80 and k.isprintable() and "/" not in k for k in keys):
        return "/".join(keys)
    return None


def _chosen(obj, key: str, path, tensor: type):
    """The state dict at `key` (keys of nested dicts joined by "/"; a top-level key holding "/" as it is)."""
    node, keys = obj, ()
    parts = [key] if key in _str_items(obj) else key.split("/")
    for part in parts:
        held = _str_items(node)
        if part not in held:
            here = f"checkpoint{indexed(keys)}" if keys else "the checkpoint"
            listed = sorted(held)
            shown_keys = ", ".join(shown(k) for k in listed[:12]) + (" ..." if len(listed) > 12 else "")
            raise FormatError(f"{parameter('key', True)}{shown(key)[1:-1]}: {here} has no key {shown(part)}"
                              + (f" (it has {shown_keys})" if listed else ""), path=path)
        node, keys = held[part], keys + (part,)
    tensors = _tensors_by_name(node, tensor)
    if tensors is None:
        raise FormatError(f"{parameter('key', True)}{shown(key)[1:-1]}: checkpoint{indexed(keys)} is {shown(node)}, not a state dict "
                          "(a dict of tensors by name)", path=path)
    return keys, tensors


def find_state_dict(obj, path, tensor: type, key: str | None = None) -> tuple:
    """(the keys leading to the state dict in `obj`, () at the top; its `tensor`s by name); FormatError if none.

    `obj` is what the pickle machine built; `tensor` the type of the
    records a tensor rebuild returns; `key` the read settings' key.
    """
    if key is not None:
        if not isinstance(obj, PickledDict):
            raise FormatError(f"{parameter('key', True)}{shown(key)[1:-1]}: the file holds {shown(obj)}, not a checkpoint dict",
                              path=path)
        return _chosen(obj, key, path, tensor)
    if isinstance(obj, tensor):
        return (), {"0": obj}
    tensors = _tensors_by_name(obj, tensor)
    if tensors is not None:
        return (), tensors
    found, optimizers = _state_dicts(obj, tensor) if isinstance(obj, PickledDict) else ([], [])
    if len(found) == 1:
        return found[0], _tensors_by_name(_at(obj, found[0]), tensor)
    if found:
        shown_found = ", ".join(indexed(keys) for keys in found[:8]) + (" ..." if len(found) > 8 else "")
        example = _key_text(found[-1])
        name_it = (f"name it with {parameter('key')} (e.g. {parameter('key', True)}{example}), or "
                   if example is not None else "")
        raise FormatError(f"holds {len(found)} state dicts (dicts of tensors by name): {shown_found}; blobtool reads "
                          f"one: {name_it}save the one to read alone, e.g. torch.save(checkpoint{indexed(found[0])}, "
                          "path)", path=path)
    if isinstance(obj, PickledDict):
        held = ", ".join(sorted({"tensor" if isinstance(v, tensor) else shown(v).split(" ")[-1]
                                 for _, v in obj.pairs}))
        what = f"a dict of {held[:80] or 'nothing'}"
        if optimizers:
            what += (f" (the optimizer state at {', '.join(indexed(k) for k in optimizers[:4])} is not a model's "
                     "state dict)")
    else:
        what = shown(obj)
        what = what if what.startswith("a ") else f"the value {what}"
    raise FormatError(f"holds no state dict (a dict of tensors by name) but {what}; {SAVE_STATE_DICT}", path=path)
