"""PyTorch's zip checkpoints (formats/pytorch.py): state dicts read without PyTorch and without running the pickle.

The files are written by tests/helpers/ptfiles.py in torch.save's layout (pickle
protocol 2 by Python's own pickler, storages as persistent ids, one stored
record per storage). Where PyTorch is importable, one test also has it
write a file and load blobtool's reading of it.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import zipfile

import numpy as np
import pytest

from blobtool import load_all
from blobtool.errors import BlobToolError
from blobtool.formats import MAX_BLOBS, open_document
from blobtool.formats.pytorch import MAX_OPCODES
from builders import Layer, npz_bytes, write_net
from ptfiles import HOOKS as _HOOKS
from ptfiles import PID as _PID
from ptfiles import Storage, Tensor, pickle_with_torch, pt_bytes, write_pt
from ptfiles import op_int as _int
from ptfiles import op_tuple as _tuple
from ptfiles import storage_pickle as _storage_pickle
from runner import invoke, run_blobtool

RNG = np.random.default_rng(26)
W = {"conv": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
     "conv_b": RNG.standard_normal(4).astype(np.float32),
     "mean": RNG.standard_normal(4).astype(np.float32),
     "var": RNG.random(4).astype(np.float32) + 0.5,
     "gamma": RNG.standard_normal(4).astype(np.float32),
     "beta": RNG.standard_normal(4).astype(np.float32),
     "fc": RNG.standard_normal((10, 4)).astype(np.float32),
     "fc_b": RNG.standard_normal(10).astype(np.float32)}
FACTOR = 8.0


def _state_dict(prefix: str = "") -> collections.OrderedDict:
    """A port of _caffemodel()'s net as PyTorch names it: Conv2d, BatchNorm2d (with Caffe's Scale), Linear."""
    sd = collections.OrderedDict()
    sd["conv1.weight"] = Tensor(W["conv"], parameter=True)
    sd["conv1.bias"] = Tensor(W["conv_b"])
    sd["bn1.weight"] = Tensor(W["gamma"])
    sd["bn1.bias"] = Tensor(W["beta"])
    sd["bn1.running_mean"] = Tensor(W["mean"])
    sd["bn1.running_var"] = Tensor(W["var"])
    sd["bn1.num_batches_tracked"] = Tensor(np.array(100, np.int64))
    sd["fc.weight"] = Tensor(W["fc"])
    sd["fc.bias"] = Tensor(W["fc_b"])
    return collections.OrderedDict((prefix + k, v) for k, v in sd.items())


def _caffemodel(path):
    layers = [
        Layer("conv1", "Convolution", [W["conv"], W["conv_b"]], bottom=["data"], top=["conv1"]),
        Layer("bn1", "BatchNorm", [W["mean"] * FACTOR, W["var"] * FACTOR, np.array([FACTOR], np.float32)],
              bottom=["conv1"], top=["conv1"]),
        Layer("scale1", "Scale", [W["gamma"], W["beta"]], bottom=["conv1"], top=["conv1"]),
        Layer("fc", "InnerProduct", [W["fc"], W["fc_b"]], bottom=["conv1"], top=["fc"]),
    ]
    return write_net(path, "new", layers)


def _error(result) -> str:
    assert result.exit_code == 3, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("blobtool: ") and "Traceback" not in result.stderr, lines
    return lines[0]


# -- reading ---------------------------------------------------------------------------

def test_every_storage_type_and_view_reads_as_saved(tmp_path):
    shared = Storage(np.arange(20, dtype=np.float64))
    bf16_bits = np.array([0x3F80, 0xC040, 0x7F80, 0x0001], np.uint16)  # 1, -3, inf, the smallest subnormal
    sd = collections.OrderedDict([
        ("w", Tensor(W["conv"])),
        ("half", Tensor(np.array([1.5, -2.25, 65504], np.float16))),
        ("bf", Tensor(bf16_bits, bf16=True)),
        ("i8", Tensor(np.array([-128, 5, 127], np.int8))),
        ("u8", Tensor(np.array([0, 255], np.uint8))),
        ("i16", Tensor(np.array([-32768, 7], np.int16))),
        ("i32", Tensor(np.array([-2**31, 2**31 - 1], np.int32))),
        ("i64", Tensor(np.array([2**53 - 1, -5], np.int64))),
        ("flags", Tensor(np.array([True, False, True]))),
        ("scalar", Tensor(np.array(3, np.int64))),
        ("transposed", Tensor(storage=shared, offset=2, size=(3, 4), stride=(1, 3))),
        ("expanded", Tensor(storage=shared, offset=5, size=(2, 3), stride=(0, 1))),
        ("row", Tensor(storage=shared, offset=4, size=(4,), stride=(1,))),
        ("empty", Tensor(np.zeros((0, 3), np.float32))),
    ])
    path = write_pt(tmp_path / "all.pt", sd)
    blobs = dict(load_all(path))
    assert list(blobs) == list(sd)
    assert np.array_equal(blobs["w"].cpu_data().reshape(W["conv"].shape), W["conv"])
    assert blobs["w"].dtype == np.float32
    assert blobs["half"].dtype == np.float32 and blobs["half"].cpu_data().tolist() == [1.5, -2.25, 65504.0]
    expected_bf = (bf16_bits.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(blobs["bf"].cpu_data(), expected_bf)
    for name in ("i8", "u8", "i16", "i32", "i64", "flags", "scalar"):
        want = sd[name].storage.values.astype(np.float64)
        assert blobs[name].dtype == np.float64 and np.array_equal(blobs[name].cpu_data(), want), name
    base = np.arange(20, dtype=np.float64)
    assert np.array_equal(blobs["transposed"].cpu_data().reshape(3, 4),
                          np.lib.stride_tricks.as_strided(base[2:], (3, 4), (8, 24)))
    assert blobs["expanded"].cpu_data().reshape(2, 3).tolist() == [[5, 6, 7], [5, 6, 7]]
    assert blobs["row"].cpu_data().tolist() == [4, 5, 6, 7]
    assert blobs["empty"].shape == (0, 3)
    doc = open_document(path)
    assert doc.kind == "pt" and doc.format == "pytorch"
    assert [str(getattr(e.dtype, "name", e.dtype)) for e in doc.entries][:4] == ["float32", "float16", "bfloat16",
                                                                             "int8"]


def test_float_storages_are_views_of_the_mapped_file(tmp_path):
    path = write_pt(tmp_path / "w.pt", {"w": Tensor(W["conv"]), "b": Tensor(W["conv_b"])})
    doc = open_document(path)
    blob = doc.entries[0].blob()
    data = blob.cpu_data()
    assert not data.flags.owndata
    base = data
    while isinstance(getattr(base, "base", None), np.ndarray):
        base = base.base
    # The array's memory is the input's mapping, not a copy.
    assert np.shares_memory(np.frombuffer(doc.source.buf, np.uint8), data)


def test_big_endian_archives_and_deflated_storages(tmp_path):
    sd = {"w": Tensor(W["fc"]), "d": Tensor(W["fc"].astype(np.float64)), "n": Tensor(np.array(9, np.int64))}
    for kw in ({"byteorder": "big"}, {"deflate_storages": True}, {"byteorder": None}):
        blobs = dict(load_all(io.BytesIO(pt_bytes(sd, **kw))))
        assert np.array_equal(blobs["w"].cpu_data().reshape(10, 4), W["fc"]), kw
        assert np.array_equal(blobs["d"].cpu_data().reshape(10, 4), W["fc"].astype(np.float64)), kw
        assert blobs["n"].cpu_data().tolist() == [9.0], kw


def test_info_norm_convert_and_compare_work_on_it(tmp_path):
    path = write_pt(tmp_path / "port.pth", _state_dict())
    info = invoke("info", "--json", path)
    assert info.exit_code == 0, info.stderr
    import json
    record = json.loads(info.stdout)
    assert record["kind"] == "pt"
    assert [b["name"] for b in record["blobs"]] == list(_state_dict())
    assert record["blobs"][6]["dtype"] == "int64" and record["blobs"][0]["shape"] == [4, 3, 3, 3]
    norm = invoke("norm", "--json", path)
    assert norm.exit_code == 0, norm.stderr
    sums = {b["name"]: b["data"]["sumsq"] for b in json.loads(norm.stdout)["blobs"]}
    assert sums["fc.weight"] == pytest.approx(float(np.sum(W["fc"].astype(np.float64) ** 2)), rel=1e-12)
    assert sums["bn1.num_batches_tracked"] == 10000.0
    for ext in (".npz", ".safetensors"):
        out = tmp_path / f"port{ext}"
        done = invoke("convert", path, "-o", out)
        assert done.exit_code == 0, done.stderr
        same = invoke("compare", path, out)
        assert same.exit_code == 0, same.stdout + same.stderr
    arrays = np.load(tmp_path / "port.npz")
    assert np.array_equal(arrays["conv1.weight"], W["conv"])


def test_a_nested_checkpoint_is_read_through_its_one_state_dict(tmp_path):
    path = write_pt(tmp_path / "ckpt.pth", {"epoch": 7, "state_dict": _state_dict(), "best": 0.5,
                                            "optimizer": {"state": {}, "param_groups": [{"lr": 0.1}]}})
    result = invoke("info", path)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == (f"blobtool: warning: {path}: reading the state dict checkpoint['state_dict'] "
                             "(the file also holds 'epoch', 'best', 'optimizer')\n")
    assert "conv1.weight" in result.stdout
    deeper = write_pt(tmp_path / "deeper.pth", {"model": {"ema": False, "weights": _state_dict()}})
    doc = open_document(deeper)
    assert doc.notes == ["reading the state dict checkpoint['model']['weights']"]
    assert doc.meta["state_dict"] == "['model']['weights']"
    one = write_pt(tmp_path / "one.pt", Tensor(W["fc"]))
    assert [e.name for e in open_document(one).entries] == ["0"]


def test_several_state_dicts_are_listed_and_refused(tmp_path):
    path = write_pt(tmp_path / "two.pth", {"model": _state_dict(), "ema": _state_dict()})
    line = _error(invoke("info", path))
    assert line == (f"blobtool: {path}: holds 2 state dicts (dicts of tensors by name): ['model'], ['ema']; "
                    "blobtool reads one: name it with --key (e.g. --key ema), or save the one to read alone, e.g. "
                    "torch.save(checkpoint['model'], path)")


# -- what is refused --------------------------------------------------------------------

class _RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class Net:
    """A model class: what torch.save(model) pickles by reference."""


def test_a_pickle_naming_any_other_global_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    data = pickle.dumps({"w": _RunsACommand(marker)}, protocol=2)
    path = tmp_path / "evil.pt"
    path.write_bytes(pt_bytes(None, data_pkl=data))
    for command in (["info"], ["norm"], ["convert", "-o", tmp_path / "out.npz"]):
        line = _error(invoke(*command, path))
        assert f"{path}: archive/data.pkl: calls the function {os.system.__module__}.system when it is unpickled, " \
            "which no state dict does" in line
        assert "never imports or runs what a pickle names, so nothing was run" in line
    assert not marker.exists() and not (tmp_path / "out.npz").exists()
    # As a real process too: the exit code and the one line.
    done = run_blobtool("info", str(path))
    assert done.returncode == 3 and len(done.stderr.splitlines()) == 1 and not marker.exists()


def test_a_whole_pickled_model_says_to_save_its_state_dict(tmp_path):
    model = Net()
    model.weight = Tensor(W["fc"])
    data, storages = pickle_with_torch(model)
    path = tmp_path / "model.pt"
    path.write_bytes(pt_bytes(None, data_pkl=data, storages=storages))
    line = _error(invoke("info", path))
    assert f"names the class {__name__}.Net," in line
    assert line.endswith("save the weights as a state dict instead: torch.save(model.state_dict(), path))")


def test_torchscript_and_legacy_files_are_refused_with_what_to_do(tmp_path):
    script = tmp_path / "script.pt"
    script.write_bytes(pt_bytes(_state_dict(), records={"constants.pkl": b"\x80\x02].", "code/m.py": b"def f(): pass"}))
    line = _error(invoke("info", script))
    assert line == (f"blobtool: {script}: a TorchScript archive (torch.jit.save): its data.pkl rebuilds a scripted "
                    "module with code from the file, which blobtool never runs; save the weights as a state dict "
                    "instead: torch.save(model.state_dict(), path)")
    legacy = tmp_path / "legacy.pth"
    magic = pickle.dumps(0x1950a86a20f9469cfc6c, protocol=2)
    legacy.write_bytes(magic + pickle.dumps(1001, protocol=2) + pickle.dumps({"w": 1}, protocol=2))
    line = _error(invoke("info", legacy))
    assert "a PyTorch file in the legacy format (torch.save before 1.6)" in line
    assert "torch.save(torch.load(FILE, weights_only=True), NEW_FILE)" in line


@pytest.mark.parametrize("pickled, storage_bytes, message", [
    (_storage_pickle(_PID, _int(0), _tuple(_int(3), _int(4)), _tuple(_int(4), _int(1)), _HOOKS), 48, None),
    (_storage_pickle(_PID, _int(1), _tuple(_int(3), _int(4)), _tuple(_int(4), _int(1)), _HOOKS), 48,
     "a tensor of size (3, 4), stride (4, 1) at offset 1 reaches element 12 of storage '0', which holds 12"),
    (_storage_pickle(_PID, _int(0), _tuple(_int(3), _int(5)), _tuple(_int(1), _int(3)), _HOOKS), 48,
     "a tensor of size (3, 5), stride (1, 3) at offset 0 reaches element 14 of storage '0', which holds 12"),
    (_storage_pickle(_PID, _int(0), _tuple(_int(3), _int(4)), _tuple(_int(4)), _HOOKS), 48,
     "has offset 0, size (3, 4) and stride (4,): expected non-negative integers, one stride per dimension"),
    (_storage_pickle(_PID, _int(0), _tuple(_int(3), _int(4)), _tuple(_int(4), _int(1)), _HOOKS), 40,
     "storage '0' holds 12 elements of FloatStorage (48 bytes); its record archive/data/0 holds 40"),
    (_storage_pickle(_PID.replace(b"X\x01\x00\x00\x000", b"X\x01\x00\x00\x009"), _int(0),
                     _tuple(_int(3), _int(4)), _tuple(_int(4), _int(1)), _HOOKS), 48,
     "storage '9' has no record archive/data/9"),
    (_storage_pickle(_PID.replace(b"FloatStorage", b"ComplexFloatStorage"), _int(0), _tuple(_int(12)),
                     _tuple(_int(1)), _HOOKS), 48, "names the class torch.ComplexFloatStorage, which a state dict does not hold"),
    (_storage_pickle(_PID, _int(0), _tuple(_int(12)), _tuple(_int(1))), 48,
     "_rebuild_tensor_v2 is given 4 arguments; it takes 6 or 7"),
    (b"\x80\x02}X\x01\x00\x00\x00wX\x01\x00\x00\x00xQs.", 48,
     "persistent id 'x' is not ('storage', type, key, location, numel)"),
    (b"\x80\x02ccollections\nOrderedDict\n)\x81.", 48, "uses the pickle opcode NEWOBJ at byte"),
    (b"\x80\x02}q\x00", 48, "archive/data.pkl is not a readable pickle"),
    (b"\x80\x02]" + b"]a" * 1000 + b".", 48, "holds no state dict (a dict of tensors by name) but a list"),
    (b"\x80\x02" + b"N0" * (MAX_OPCODES // 2 + 1) + b"N.", 48,
     f"holds more than {MAX_OPCODES} pickle opcodes"),
], ids=["valid", "offset past the end", "strides past the end", "stride count", "record size", "no record",
        "complex storage", "argument count", "persistent id", "NEWOBJ", "cut short", "deep lists", "opcodes"])
def test_forged_tensors_and_pickles_are_refused_naming_what(tmp_path, pickled, storage_bytes, message):
    path = tmp_path / "forged.pt"
    path.write_bytes(pt_bytes(None, data_pkl=pickled, records={"data/0": bytes(range(storage_bytes))}))
    result = invoke("norm", path)
    if message is None:
        assert result.exit_code == 0, result.stderr
        return
    assert message in _error(result)


def test_too_many_zip_entries_are_refused_before_zipfile_reads_them(tmp_path):
    records = {f"data/{k}": b"" for k in range(MAX_BLOBS + 70)}
    path = tmp_path / "many.pt"
    path.write_bytes(pt_bytes({"w": Tensor(W["fc"])}, records=records))
    line = _error(invoke("info", path))
    entries = len(zipfile.ZipFile(path).infolist())
    assert entries > MAX_BLOBS + 64
    assert f"the zip directory lists {entries} entries, more than the {MAX_BLOBS} storages" in line


def test_an_npz_stays_an_npz_and_a_zip_without_data_pkl_is_not_a_checkpoint(tmp_path):
    npz = tmp_path / "w.npz"
    npz.write_bytes(npz_bytes({"data.pkl": W["fc"], "archive/data": W["fc_b"]}))
    doc = open_document(npz)
    assert doc.kind == "npz" and sorted(doc.names()) == ["archive/data", "data.pkl"]
    forced = invoke("info", "--kind", "pt", npz)
    assert "holds no PyTorch archives (<archive>/data.pkl)" in _error(forced)
    two = tmp_path / "two.pt"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for folder in ("a", "b"):
            archive.writestr(f"{folder}/data.pkl", pickle.dumps({}, protocol=2))
    two.write_bytes(buf.getvalue())
    assert "holds 2 (" in _error(invoke("info", two))


# -- compare against a .caffemodel, prefixes --------------------------------------------

def test_compare_names_torch_matches_a_pth_port_in_one_command(tmp_path):
    net = _caffemodel(tmp_path / "model.caffemodel")
    port = write_pt(tmp_path / "port.pth", _state_dict())
    result = invoke("compare", "--names", "torch", net, port)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stderr == ""
    assert "8 blob(s) match" in result.stdout
    # A value changed in the port is found, under its PyTorch name.
    changed = _state_dict()
    changed["bn1.running_var"] = Tensor(W["var"] * 1.001)
    differs = invoke("compare", "--names", "torch", net, write_pt(tmp_path / "off.pth", changed))
    assert differs.exit_code == 1 and "bn1.running_var" in differs.stdout


@pytest.mark.parametrize("prefix", ["module.", "model.backbone."])
def test_a_wrapper_prefix_is_found_and_said(tmp_path, prefix):
    net = _caffemodel(tmp_path / "model.caffemodel")
    port = write_pt(tmp_path / "port.pth", _state_dict(prefix))
    result = invoke("compare", "--names", "torch", net, port)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stderr == (f"blobtool: warning: {port}: names compared without the prefix {prefix!r} (8 of 9 "
                             f"then match {net}'s); --strip-prefix {prefix} says so, --strip-prefix '' compares "
                             "them as they are\n")
    # The other way round: the prefix is added to the net's names.
    back = invoke("compare", "--names", "torch", port, net)
    assert back.exit_code == 0, back.stdout + back.stderr
    assert f"with the prefix {prefix!r} added" in back.stderr
    asked = invoke("compare", "--names", "torch", net, port, "--strip-prefix", prefix)
    assert asked.exit_code == 0 and asked.stderr == ""
    off = invoke("compare", "--names", "torch", net, port, "--strip-prefix", "")
    assert off.exit_code == 1 and "only in" in off.stdout.lower() and off.stderr == ""


def test_strip_then_add_replaces_one_prefix_by_another(tmp_path):
    a = write_pt(tmp_path / "a.pth", _state_dict("model."))
    b = write_pt(tmp_path / "b.pth", _state_dict("module."))
    found = invoke("compare", a, b)
    assert found.exit_code == 0, found.stdout + found.stderr
    assert "without the prefix 'module.' and with the prefix 'model.' added" in found.stderr
    asked = invoke("compare", a, b, "--strip-prefix", "module.", "--add-prefix", "model.")
    assert asked.exit_code == 0 and asked.stderr == ""
    selected = invoke("compare", a, b, "--strip-prefix", "module.", "--add-prefix", "model.",
                      "--blob", "model.fc.*")
    assert selected.exit_code == 0 and "2 blob(s) match" in selected.stdout


def test_a_prefix_that_makes_two_names_one_is_refused(tmp_path):
    sd = _state_dict()
    sd["module.fc.bias"] = Tensor(W["fc_b"])
    a = write_pt(tmp_path / "a.pth", _state_dict())
    b = write_pt(tmp_path / "b.pth", sd)
    result = invoke("compare", a, b, "--strip-prefix", "module.")
    assert result.exit_code == 2
    assert "--strip-prefix module. names two blobs 'fc.bias' (fc.bias and module.fc.bias)" in result.stderr


# -- PyTorch itself, where it is installed ----------------------------------------------

def test_pytorch_reads_what_the_tests_write_and_blobtool_reads_what_pytorch_writes(tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (never required)")
    ours = write_pt(tmp_path / "ours.pth", _state_dict())
    loaded = torch.load(ours, weights_only=True)
    assert list(loaded) == list(_state_dict())
    for name, tensor in _state_dict().items():
        want = tensor.storage.values.reshape(tensor.size)
        assert np.array_equal(loaded[name].detach().numpy(), want), name
    model = torch.nn.DataParallel(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                                      torch.nn.Linear(4, 2)))
    extra = {"half": torch.randn(3, 2).half(), "bf16": torch.randn(5).bfloat16(), "ints": torch.arange(6).int(),
             "flags": torch.tensor([True, False]), "transposed": torch.randn(3, 4).t(),
             "narrowed": torch.arange(10.0, dtype=torch.float64)[2:7]}
    saved = tmp_path / "theirs.pth"
    state = {**model.state_dict(), **extra}
    torch.save({"state_dict": state, "epoch": 1}, saved)
    blobs = dict(load_all(saved))
    assert list(blobs) == list(state)
    for name, value in state.items():
        want = value.float() if value.dtype in (torch.bfloat16, torch.float16) else value
        want = want.double() if not want.is_floating_point() else want
        assert np.array_equal(blobs[name].cpu_data().reshape(tuple(value.shape)), want.contiguous().numpy()), name
    # One command compares the DataParallel port with a plain one, the prefix found.
    plain, wrapped = tmp_path / "plain.pth", tmp_path / "wrapped.pth"
    torch.save(model.module.state_dict(), plain)
    torch.save(model.state_dict(), wrapped)
    result = invoke("compare", plain, wrapped)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "without the prefix 'module.' (9 of 9 then match" in result.stderr


def test_the_reader_raises_only_blobtool_errors_on_its_own_bad_input():
    with pytest.raises(BlobToolError):
        open_document(io.BytesIO(pt_bytes(None, data_pkl=b"\x80\x02")))


def test_writing_a_pt_file_is_refused_pointing_at_safetensors(tmp_path):
    port = write_pt(tmp_path / "port.pth", _state_dict())
    result = invoke("convert", port, "-o", tmp_path / "again.pth")
    assert result.exit_code == 2 and not (tmp_path / "again.pth").exists()
    assert result.stderr.endswith("PyTorch loads .safetensors (safetensors.torch.load_file): write that\n")
