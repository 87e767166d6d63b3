"""Hostile PyTorch checkpoints: pickles that change what was checked, nest, collide, or claim more than they hold.

Each case is a .pt built here opcode by opcode (ptfiles), from what pickle's
own Unpickler would do with it: a value changed after its check (BUILD,
SETITEM, APPEND onto a rebuilt tensor or its storage), a 300,000-deep tuple
hashed as a key, a memo slot far out, keys that all hash alike, a view
repeating one stored element, a zip directory larger than its end record
says. Where the old way crashed the process, the case runs in a subprocess.
"""

from __future__ import annotations

import collections
import io
import struct
import subprocess
import sys
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

from blobtool import load_all, state_dict
from blobtool.errors import BlobToolError
from blobtool.formats import MAX_BLOBS, open_document
from blobtool.formats.pickled import MAX_NESTING
from blobtool.formats.pytorch import MAX_OPCODES
from builders import npz_bytes
from ptfiles import HOOKS, PID, REBUILD, Storage, Tensor, op_int, op_long, op_str, op_tuple, pt_bytes, \
    storage_pickle, write_pt
from runner import invoke, run_blobtool, subprocess_env

_W = np.arange(12, dtype=np.float32)
_ARGS = (op_int(0), op_tuple(op_int(3), op_int(4)), op_tuple(op_int(4), op_int(1)), HOOKS)  # HOOKS: False, {}
# BUILD's state for a slotted object: (None, {"storage_offset": 1 << 20}).
_STATE = b"N}" + op_str("storage_offset") + op_int(1 << 20) + b"s\x86"


def _pt(tmp_path, data_pkl: bytes, storage=_W, name="hostile.pt"):
    path = tmp_path / name
    path.write_bytes(pt_bytes(None, data_pkl=data_pkl, records={"data/0": storage.tobytes()}))
    return path


def _one_line(result) -> str:
    assert result.exit_code == 3, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_the_hand_made_pickle_reads_as_the_tensor_it_describes(tmp_path):
    # The base every case below damages: it must read, or the cases prove nothing.
    loaded = load_all(_pt(tmp_path, storage_pickle(PID, *_ARGS)))
    np.testing.assert_array_equal(loaded["w"].cpu_data().reshape(3, 4), _W.reshape(3, 4))


@pytest.mark.parametrize("data_pkl, refused", [
    # BUILD onto what _rebuild_tensor_v2 returned: its offset past the storage after the check.
    (storage_pickle(PID, *_ARGS, after_tensor=_STATE + b"b"), "uses BUILD at byte"),
    # BUILD onto the storage record (its numel raised after the size check).
    (storage_pickle(PID, *_ARGS, after_pid=b"N}" + op_str("numel") + op_int(1 << 30) + b"s\x86b"),
     "uses BUILD at byte"),
    # BUILD onto torch.FloatStorage itself (its element type made 'U1').
    (storage_pickle(PID.replace(b"ctorch\nFloatStorage\n", b"ctorch\nFloatStorage\nN}" + op_str("code")
                                + op_str("U1") + b"s\x86b"), *_ARGS), "uses BUILD at byte"),
    # SETITEM and APPEND onto a rebuilt tensor.
    (storage_pickle(PID, *_ARGS, after_tensor=op_str("offset") + op_int(99) + b"s"), "uses SETITEM at byte"),
    (storage_pickle(PID, *_ARGS, after_tensor=op_int(99) + b"a"), "uses APPEND at byte"),
], ids=["BUILD on the tensor", "BUILD on the storage", "BUILD on the storage type", "SETITEM on the tensor",
        "APPEND on the tensor"])
def test_nothing_a_pickle_does_changes_a_checked_tensor(tmp_path, data_pkl, refused):
    path = _pt(tmp_path, data_pkl)
    out = tmp_path / "x.npy"
    # In a process of its own: the old reader died of SIGSEGV here.
    for args in (["norm", path], ["convert", path, "-o", out]):
        result = run_blobtool(*args, capture_output=True, text=True, timeout=60)
        assert result.returncode == 3, (args, result.returncode, result.stderr)
        assert refused in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert not out.exists()


def test_a_container_is_not_changed_after_it_was_placed(tmp_path):
    # The state dict is memoized, placed under "model", then fetched and given
    # a tensor whose offset was never checked against anything.
    sd = b"}q\x01" + op_str("w") + REBUILD + b"(" + PID + b"Q" + b"".join(_ARGS) + b"tRs"
    data_pkl = (b"\x80\x02}" + op_str("model") + sd + b"s" + b"h\x01" + op_str("late") + op_int(1) + b"s0.")
    line = _one_line(invoke("info", _pt(tmp_path, data_pkl)))
    assert "uses SETITEM at byte" in line and "to change a dict after it was placed" in line


def test_a_list_cannot_hold_itself():
    from blobtool.formats.pickled import run_pickle

    def refuse(text):
        return BlobToolError(text)

    def run(data):
        return run_pickle(data, max_opcodes=100, callables={}, persistent=None, refuse=refuse,
                          not_allowed=lambda m, n: BlobToolError(n))

    with pytest.raises(BlobToolError, match="puts a list into itself"):
        run(b"\x80\x02]q\x00h\x00a.")
    # Two lists, each into the other: the second placing changes a placed list.
    with pytest.raises(BlobToolError, match="to change a list after it was placed"):
        run(b"\x80\x02]q\x00]q\x01h\x00a0h\x01a.")


_DEEP = 300_000


@pytest.mark.parametrize("container", [
    b"}" + b"N" + b"\x85" * _DEEP + b"Ns.",            # a dict's key
    b"\x8f(" + b"N" + b"\x85" * _DEEP + b"\x90.",      # a set's item
    b"(" + b"N" + b"\x85" * _DEEP + b"\x91.",          # a frozenset's item
    b"]" + b"]" * _DEEP + b"a" * _DEEP + b".",         # lists in lists
], ids=["dict key", "set item", "frozenset item", "nested lists"])
def test_deep_nesting_is_refused_in_the_command_and_the_library(tmp_path, container):
    path = _pt(tmp_path, b"\x80\x02" + container)
    result = run_blobtool("info", path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, (result.returncode, result.stderr)
    assert f"nests containers more than {MAX_NESTING} deep" in result.stderr, result.stderr
    code = "import sys, blobtool\ntry:\n    blobtool.load_all(sys.argv[1])\nexcept blobtool.BlobToolError as e:\n" \
           "    print(e)\n    sys.exit(3)\n"
    lib = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60,
                         env=subprocess_env())
    assert lib.returncode == 3, (lib.returncode, lib.stderr)


def test_nesting_up_to_the_limit_reads(tmp_path):
    # A state dict 62 dicts deep is still a checkpoint (not looked into past 4 levels, but read without harm).
    inner = b"}" + op_str("k") + b"N" + b"s"
    data = b"\x80\x02" + b"}" + op_str("a") + b"".join([b"}" + op_str("a")] * (MAX_NESTING - 3)) + inner \
        + b"s" * (MAX_NESTING - 2) + b"."
    line = _one_line(invoke("info", _pt(tmp_path, data)))
    assert "holds no state dict" in line


def test_a_huge_tensor_of_no_elements_is_one_line(tmp_path):
    big = op_long(1 << 62)
    args = (op_int(0), op_tuple(op_int(0), big, big), op_tuple(op_int(0), op_int(0), op_int(0)), HOOKS)
    line = _one_line(invoke("info", _pt(tmp_path, storage_pickle(PID, *args))))
    assert "spans more bytes than an array can address" in line


def test_an_index_past_int64_is_refused(tmp_path):
    args = (op_long(1 << 64), op_tuple(op_int(3), op_int(4)), op_tuple(op_int(4), op_int(1)), HOOKS)
    line = _one_line(invoke("info", _pt(tmp_path, storage_pickle(PID, *args))))
    assert "has offset <an integer of 65 bits>" in line


def _peak_while_refused(data_pkl: bytes, match: str) -> int:
    """The peak of Python's allocations (tracemalloc) while a .pt of `data_pkl` is opened and refused."""
    data = pt_bytes(None, data_pkl=data_pkl, records={})
    tracemalloc.start()
    try:
        with pytest.raises(BlobToolError, match=match):
            open_document(io.BytesIO(data))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_far_memo_slot_costs_what_is_stored_not_the_slot():
    peak = _peak_while_refused(b"\x80\x02Nr" + struct.pack("<I", 1 << 25) + b".", "holds no state dict")
    assert peak < 16 << 20, peak  # pickle.Unpickler: an array of 2**25 slots, 256 MB


@pytest.mark.slow
def test_the_costliest_pickle_within_the_opcode_limit_is_bounded_in_memory():
    # Every opcode an empty dict left on the stack: the most objects per opcode.
    peak = _peak_while_refused(b"\x80\x02" + b"}" * (MAX_OPCODES - 3) + b".", "holds no state dict")
    assert peak < 64 << 20, peak  # measured: 40 MB (72 bytes a dict), whatever the file's size


def test_an_expanded_view_larger_than_its_storage_is_refused(tmp_path):
    pid = PID.replace(op_int(12), op_int(1))
    args = (op_int(0), op_tuple(op_int(8192), op_int(8192)), op_tuple(op_int(0), op_int(0)), HOOKS)
    path = _pt(tmp_path, storage_pickle(pid, *args), storage=np.ones(1, np.float32))
    out = tmp_path / "x.npy"
    line = _one_line(invoke("convert", path, "-o", out))
    assert "has 67108864 elements over storage '0' of 1 (an expanded view" in line
    assert "save tensor.contiguous()" in line
    assert not out.exists()


def test_a_view_within_its_storage_still_reads(tmp_path):
    # Stride 0 over a storage at least as large as the tensor: read, copied into C order.
    storage = Storage(np.arange(6, dtype=np.float32))
    path = write_pt(tmp_path / "v.pt", {"w": Tensor(storage=storage, offset=1, size=(2, 3), stride=(0, 1))})
    np.testing.assert_array_equal(load_all(path)["w"].cpu_data().reshape(2, 3), [[1, 2, 3], [1, 2, 3]])


def _timed_error(tmp_path, data_pkl) -> float:
    path = _pt(tmp_path, data_pkl)
    start = time.process_time()
    result = invoke("info", path)
    elapsed = time.process_time() - start
    assert result.exit_code == 3 and "holds no state dict" in result.stderr, result.stderr
    return elapsed


def test_keys_that_all_hash_alike_cost_no_more_than_others(tmp_path):
    # Python's int hash is the value modulo 2**61 - 1: all these hash to 0.
    # pickle.Unpickler: 5.1 s for 20,000, over 60 s for 60,000.
    keys = b"".join(op_long(k * ((1 << 61) - 1)) + b"N" for k in range(1, 60_001))
    elapsed = _timed_error(tmp_path, b"\x80\x02}(" + keys + b"u.")
    assert elapsed < 5, elapsed  # measured: 0.3 to 0.5 s


def test_a_big_tuple_reused_as_a_key_is_not_hashed_again_and_again(tmp_path):
    # pickle.Unpickler: 9.2 s (each SETITEMS hashes the 20,000-int tuple again).
    big = b"(" + b"".join(op_int(k) for k in range(20_000)) + b"tq\x00"
    data = b"\x80\x02" + big + b"0}(" + b"h\x00N" * 60_000 + b"u."
    elapsed = _timed_error(tmp_path, data)
    assert elapsed < 4, elapsed  # measured: 0.3 to 0.5 s


def test_a_deflated_storage_is_inflated_in_place_not_twice():
    # 64 MiB of zeros, deflated: the blob's array and one 4 MiB chunk at a time.
    size = 64 << 20
    values = np.zeros(size // 4, np.float32)
    data = pt_bytes({"w": Tensor(values)}, deflate_storages=True)
    with open_document(io.BytesIO(data)) as doc:
        tracemalloc.start()
        try:
            blob = doc.entries[0].blob()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert blob.count == values.size
    assert peak < size + (24 << 20), peak  # measured: size + 15 MiB; readinto of the whole member: twice the size


def _forged_directory(entries: int, declared: int, members) -> bytes:
    """A zip of `members` plus `entries` empty ones, its end record saying `declared` entries."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        for k in range(entries):
            archive.writestr(f"archive/pad/{k}", b"")
    data = bytearray(out.getvalue())
    end = data.rfind(b"PK\x05\x06")
    struct.pack_into("<HH", data, end + 8, declared, declared)
    return bytes(data)


@pytest.mark.parametrize("entries", [MAX_BLOBS + 100, 70_000], ids=["end record", "past 65,535: ZIP64 records"])
def test_a_directory_larger_than_its_end_record_says_is_refused_before_zipfile_reads_it(tmp_path, entries):
    # Past 65,535 entries zipfile writes ZIP64 records, which it reads
    # whatever the end record's fields say: the forged count of 2 there too.
    good = zipfile.ZipFile(io.BytesIO(pt_bytes({"w": Tensor(_W)})))
    members = {info.filename: good.read(info) for info in good.infolist()}
    path = tmp_path / "forged.pt"
    path.write_bytes(_forged_directory(entries, 2, members))
    line = _one_line(invoke("info", path))
    assert f"the zip directory lists more than {MAX_BLOBS + 64} entries" in line
    npz = zipfile.ZipFile(io.BytesIO(npz_bytes({"a": np.ones(3, np.float32)})))
    path = tmp_path / "forged.npz"
    path.write_bytes(_forged_directory(entries, 2, {i.filename: npz.read(i) for i in npz.infolist()}))
    line = _one_line(invoke("info", path))
    assert f"the zip directory lists more than {MAX_BLOBS + 64} entries" in line


# -- checkpoints with optimizer state ------------------------------------------------------

def _model():
    return collections.OrderedDict([("conv.weight", Tensor(np.ones((2, 1, 3, 3), np.float32), parameter=True)),
                                    ("conv.bias", Tensor(np.zeros(2, np.float32), parameter=True))])


def _sgd_momentum():
    return {"state": {0: {"momentum_buffer": Tensor(np.full((2, 1, 3, 3), 0.5, np.float32))},
                      1: {"momentum_buffer": Tensor(np.full(2, 0.5, np.float32))}},
            "param_groups": [{"lr": 0.1, "momentum": 0.9, "dampening": 0, "weight_decay": 0.0005,
                              "nesterov": False, "params": [0, 1]}]}


def _adam():
    return {"state": {k: {"step": Tensor(np.array(1.0, np.float32)), "exp_avg": Tensor(np.ones(2, np.float32)),
                          "exp_avg_sq": Tensor(np.ones(2, np.float32))} for k in (0, 1)},
            "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0,
                              "amsgrad": False, "params": [0, 1]}]}


@pytest.mark.parametrize("checkpoint, key", [
    ({"state_dict": _model(), "epoch": 3, "optimizer": _sgd_momentum()}, "state_dict"),
    ({"state_dict": _model(), "epoch": 3, "optimizer": _adam()}, "state_dict"),
    ({"model": _model(), "optimizer": _sgd_momentum(), "lr_scheduler": {"last_epoch": 3, "_last_lr": [0.1]},
      "epoch": 3}, "model"),
], ids=["SGD with momentum", "Adam", "torchvision's layout"])
def test_a_training_checkpoint_reads_its_model_past_the_optimizer_state(tmp_path, checkpoint, key):
    path = write_pt(tmp_path / "ckpt.pth", checkpoint)
    result = invoke("info", "--json", path)
    assert result.exit_code == 0, result.stderr
    assert f"reading the state dict checkpoint['{key}']" in result.stderr
    assert list(state_dict(path)) == ["conv.weight", "conv.bias"]


def _ema():
    ema = _model()
    ema["conv.bias"] = Tensor(np.full(2, 7, np.float32), parameter=True)
    return ema


def test_several_real_state_dicts_are_picked_by_key(tmp_path):
    path = write_pt(tmp_path / "ema.pth", {"model": _model(), "ema": _ema(), "optimizer": _adam()})
    line = _one_line(invoke("info", path))
    assert "holds 2 state dicts (dicts of tensors by name): ['model'], ['ema']; blobtool reads one: name it with " \
           "--key (e.g. --key ema)" in line
    result = invoke("norm", "--json", "--key", "ema", "--blob", "conv.bias", path)
    assert result.exit_code == 0, result.stderr
    assert '"asum": 14.0' in result.stdout, result.stdout
    assert load_all(path, key="ema")["conv.bias"].cpu_data().tolist() == [7, 7]
    assert state_dict(path, key="model")["conv.bias"].tolist() == [0, 0]
    line = _one_line(invoke("info", "--key", "swa", path))
    assert line.endswith("--key swa: the checkpoint has no key 'swa' (it has 'ema', 'model', 'optimizer')")
    line = _one_line(invoke("info", "--key", "optimizer", path))
    assert "--key optimizer: checkpoint['optimizer'] is a dict, not a state dict" in line
    nested = write_pt(tmp_path / "nested.pth", {"run": {"ema": _ema(), "model": _model()}})
    assert load_all(nested, key="run/ema")["conv.bias"].cpu_data().tolist() == [7, 7]


def test_key_applies_in_worker_processes_too(tmp_path):
    paths = [write_pt(tmp_path / f"ema{k}.pth", {"model": _model(), "ema": _ema()}) for k in range(2)]
    env = subprocess_env(BLOBTOOL_PARALLEL_MIN_BYTES="0")
    result = run_blobtool("norm", "--json", "-j", "2", "--key", "ema", *paths, capture_output=True, text=True,
                          env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count('"conv.bias"') == 2 and "14" in result.stdout


def test_a_bad_key_is_a_usage_error():
    result = invoke("info", "--key", "a//b", "x.pt")
    assert result.exit_code == 2 and "'a//b' is not a key" in result.stderr


def test_torch_s_metadata_on_the_state_dict_is_read_as_torch_writes_it(tmp_path):
    # state_dict() returns an OrderedDict with a _metadata attribute: pickled as BUILD with {"_metadata": ...}.
    meta = b"}" + op_str("_metadata") + b"ccollections\nOrderedDict\n)R" + b"s"
    data_pkl = (b"\x80\x02ccollections\nOrderedDict\n)R" + op_str("w") + REBUILD + b"(" + PID + b"Q"
                + b"".join(_ARGS) + b"tRs" + meta + b"b.")
    loaded = load_all(_pt(tmp_path, data_pkl))
    assert list(loaded) == ["w"]


def _names_of_one_tensor(count: int) -> bytes:
    """A dict of `count` names, each the same tensor (the pickle's memo: one rebuild, many keys)."""
    tensor = REBUILD + b"(" + PID + b"Q" + b"".join(_ARGS) + b"tRq\x05"
    return b"}(" + op_str("n0") + tensor + b"".join(op_str(f"n{k}") + b"h\x05" for k in range(1, count)) + b"u"


def test_one_tensor_under_more_names_than_blobs_are_allowed_is_refused(tmp_path):
    line = _one_line(invoke("info", _pt(tmp_path, b"\x80\x02" + _names_of_one_tensor(MAX_BLOBS + 1) + b".")))
    assert f"holds a state dict of {MAX_BLOBS + 1} tensors, more than {MAX_BLOBS}" in line


def test_one_big_dict_under_many_keys_is_looked_at_once(tmp_path):
    # A dict of 60,000 names of one tensor, the value of 30,000 keys: looked
    # at once, it is one state dict (too big); looked at per key, 30,000 x 60,000.
    inner = _names_of_one_tensor(60_000)
    data = (b"\x80\x02}(" + op_str("k0") + inner + b"q\x06"
            + b"".join(op_str(f"k{k}") + b"h\x06" for k in range(1, 30_000)) + b"u.")
    path = _pt(tmp_path, data)
    start = time.process_time()
    line = _one_line(invoke("info", path))
    assert time.process_time() - start < 10  # measured: about 1 s
    assert "more than 8192 (blobtool's limit)" in line


# -- what a review found past the cases above -------------------------------------------------

_T = REBUILD + b"(" + PID + b"Q" + b"".join(_ARGS) + b"tR"   # the tensor of _ARGS
_SD = b"}" + op_str("w") + _T + b"s"                         # {"w": it}


def _top(*pairs) -> bytes:
    return b"\x80\x02}(" + b"".join(pairs) + b"u."


@pytest.mark.parametrize("data_pkl", [
    _top(op_str("model") + _SD, op_str("model") + op_int(5)),     # a later duplicate wins, as in a dict
    _top(op_int(1) + _SD, b"\x88" + op_int(5)),                   # 1 and True: one key in Python
    _top(b"G" + struct.pack(">d", float("nan")) + _SD),            # NaN is no key a path can name
    _top(op_str("a") + b"}" + op_str("b") + _SD + b"s", op_str("a") + op_int(5)),
], ids=["duplicate key", "1 and True", "NaN key", "nested duplicate"])
def test_keys_that_are_no_path_to_a_state_dict_are_one_line(tmp_path, data_pkl):
    line = _one_line(invoke("info", _pt(tmp_path, data_pkl)))
    assert "holds no state dict" in line


def test_odd_keys_beside_the_state_dict_are_shown_short(tmp_path):
    data = _top(op_str("a") + _SD, op_long(10 ** 5000) + op_int(1), b"(" + op_int(1) + b"t" + op_int(2))
    result = invoke("info", _pt(tmp_path, data))
    assert result.exit_code == 0, result.stderr
    assert "(the file also holds <an integer of 16610 bits>, (1,))" in result.stderr
    long_key = _top(op_str("a") + _SD, op_str("x" * 1_000_000) + _SD)
    line = _one_line(invoke("info", _pt(tmp_path, long_key)))
    assert len(line) < 1000 and "holds 2 state dicts" in line and "--key" not in line


def test_one_list_given_to_ordered_dict_again_and_again_is_refused(tmp_path):
    pairs = b"](" + b"".join(op_tuple(op_str(f"k{k}"), op_int(k)) for k in range(15_000)) + b"eq\x09"
    calls = b"".join(op_str(f"d{k}") + b"ccollections\nOrderedDict\n(h\x09tR" for k in range(15_000))
    data = b"\x80\x02}(" + op_str("first") + b"ccollections\nOrderedDict\n(" + pairs + b"tR" + calls + b"u."
    start = time.process_time()
    line = _one_line(invoke("info", _pt(tmp_path, data)))
    assert time.process_time() - start < 5  # the copies: 13.7 s and 1.8 GB
    assert "gives OrderedDict the same list of pairs twice" in line


def test_an_empty_tensor_with_strides_past_any_array_reads(tmp_path):
    args = (op_int(0), op_tuple(op_int(0), op_int(2)), op_tuple(op_long(1 << 62), op_int(1)), HOOKS)
    path = _pt(tmp_path, storage_pickle(PID, *args))
    for command in (("norm",), ("convert", "-o", tmp_path / "x.npy"), ("compare", path)):
        result = invoke(command[0], path, *command[1:])
        assert result.exit_code == 0, (command, result.stderr)
    assert np.load(tmp_path / "x.npy").shape == (0, 2)


def _directory(data: bytes):
    """(directory offset, [(header, name, extra, comment)]) of a zip without ZIP64 records."""
    end = data.rfind(b"PK\x05\x06")
    count, _, offset = struct.unpack_from("<HII", data, end + 10)
    entries, pos = [], offset
    for _ in range(count):
        lengths = struct.unpack_from("<HHH", data, pos + 28)
        parts, at = [], pos + 46
        for n in lengths:
            parts.append(data[at:at + n])
            at += n
        entries.append((bytearray(data[pos:pos + 46]), *parts))
        pos = at
    return offset, entries


def _rebuilt(data: bytes, entries, *, offset_shift=0, end_count=None, comment=b"") -> bytes:
    """The zip's bytes up to its directory, then `entries` as its directory, then an end record."""
    offset, _ = _directory(data)
    cd = b"".join(bytes(head[:28]) + struct.pack("<HHH", len(name), len(extra), len(text)) + bytes(head[34:])
                  + name + extra + text for head, name, extra, text in entries)
    count = len(entries) if end_count is None else end_count
    return (data[:offset] + cd + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, len(cd),
                                              offset + offset_shift, len(comment)) + comment)


def test_a_deflated_member_declaring_more_than_the_file_holds_is_refused(tmp_path):
    # Its sizes forged in a ZIP64 extra field: 2**46 bytes, "deflated" from 2**46 / 1000.
    for kind, data in (("pt", pt_bytes({"w": Tensor(_W)}, deflate_storages=True)),
                       ("npz", npz_bytes({"a": np.ones(3, np.float32)}, compressed=True))):
        offset, entries = _directory(data)
        target = next(i for i, e in enumerate(entries) if e[1].endswith((b"data/0", b"a.npy")))
        head, name, extra, text = entries[target]
        struct.pack_into("<II", head, 20, 0xFFFFFFFF, 0xFFFFFFFF)
        entries[target] = (head, name, struct.pack("<HHQQ", 1, 16, 1 << 46, (1 << 46) // 1000) + extra, text)
        path = tmp_path / f"forged.{kind}"
        path.write_bytes(_rebuilt(data, entries))
        line = _one_line(invoke("norm", path))
        assert "stored bytes from byte" in line and "lie outside the zip's members" in line, line


def test_a_member_whose_offset_zipfile_makes_negative_is_refused(tmp_path):
    # The directory's offset declared past where it is: zipfile shifts every
    # header offset back by the difference, and one made to land below 0.
    data = pt_bytes(None, data_pkl=storage_pickle(PID, *_ARGS), records={"data/0": _W.tobytes()})
    shift = 50
    offset, entries = _directory(data)
    for head, name, _, _ in entries:
        moved = struct.unpack_from("<I", head, 42)[0] + shift
        struct.pack_into("<I", head, 42, shift - 10 if name.endswith(b"data/0") else moved)
    comment = b"PK\x03\x04" + bytes(26) + bytes(shift)  # a local header for it to find in the tail
    path = tmp_path / "shifted.pt"
    path.write_bytes(_rebuilt(data, entries, offset_shift=shift, comment=comment))
    line = _one_line(invoke("norm", "--kind", "pt", path))
    assert "lie outside the zip's members" in line


def test_entries_are_counted_wherever_zipfile_finds_the_directory(tmp_path):
    # The declared offset past the file's end (zipfile reads the directory from before the end record).
    data = pt_bytes({"w": Tensor(_W)})
    shift = 100
    offset, entries = _directory(data)
    for head, *_ in entries:
        struct.pack_into("<I", head, 42, struct.unpack_from("<I", head, 42)[0] + shift)
    extra = [(bytearray(struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                    0, 0, 0, shift)), f"archive/p/{k}".encode(), b"", b"")
             for k in range(MAX_BLOBS + 100)]
    path = tmp_path / "past.pt"
    path.write_bytes(_rebuilt(data, entries + extra, offset_shift=shift, end_count=2))
    line = _one_line(invoke("info", "--kind", "pt", path))
    assert "the zip directory lists more than" in line
    # A ZIP64 locator pointing past the file: zipfile 3.11 reads the record before it all the same.
    members = zipfile.ZipFile(io.BytesIO(pt_bytes({"w": Tensor(_W)})))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for info in members.infolist():
            archive.writestr(info, members.read(info))
        for k in range(70_000):
            archive.writestr(f"archive/p/{k}", b"")
    forged = bytearray(out.getvalue())
    struct.pack_into("<Q", forged, forged.rfind(b"PK\x06\x07") + 8, 1 << 40)
    path.write_bytes(bytes(forged))
    line = _one_line(invoke("info", "--kind", "pt", path))
    assert "the zip directory lists" in line


def test_a_deflated_storage_viewed_by_many_tensors_is_inflated_once(tmp_path, monkeypatch):
    import blobtool.formats.pytorch as pt_format

    storage = Storage(np.zeros(1 << 20, np.float32))
    views = {f"t{k}": Tensor(storage=storage, offset=k, size=(1,), stride=(1,)) for k in range(20)}
    path = write_pt(tmp_path / "shared.pt", views, deflate_storages=True)
    calls = []
    real = pt_format.inflate_member
    monkeypatch.setattr(pt_format, "inflate_member", lambda *a: calls.append(a[1].filename) or real(*a))
    assert invoke("norm", path).exit_code == 0
    assert len(calls) == 1, calls  # each of the 20 views inflated it again, and kept all of it


@pytest.mark.parametrize("checkpoint, key, blobs", [
    ({"a/b": "SD", "c": "SD"}, "a/b", ["w"]),         # a key holding "/" is taken whole first
    ({"a": "SD", 2: "SD"}, "a", ["w"]),               # an int key beside it
], ids=["slash in a key", "mixed keys"])
def test_key_names_what_the_checkpoint_holds(tmp_path, checkpoint, key, blobs):
    made = {k: collections.OrderedDict(w=Tensor(_W)) for k in checkpoint}
    path = write_pt(tmp_path / "keys.pt", made)
    result = invoke("info", "--json", "--key", key, path)
    assert result.exit_code == 0, result.stderr
    with pytest.raises(BlobToolError, match="a non-empty str"):
        load_all(path, key=5)
