"""convert --rename OLD=NEW and --drop LAYER (blobtool.surgery.rename): the net rewritten, every other byte kept.

The oracle is the protobuf library: the input parsed, the same change made to
the message by hand, and the two serialized alike (unknown fields included,
which the builders put in every layer) must be the same bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

import blobtool
from blobtool._pb import blobtool_caffe_pb2 as pb
from builders import Layer, h5_net_bytes, varint, write_h5, write_net
from runner import assert_error, assert_usage, invoke, ok, run_blobtool

RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def lenet_like() -> list:
    return [Layer("conv1", "Convolution", [rand(4, 1, 3, 3), rand(4)], bottom=["data"], top=["conv1"]),
            Layer("relu1", "ReLU", bottom=["conv1"], top=["conv1"]),
            Layer("ip1", "InnerProduct", [rand(3, 16), rand(3)], bottom=["conv1"], top=["ip1"]),
            Layer("relu2", "ReLU", bottom=["ip1"], top=["ip1"]),
            Layer("ip2", "InnerProduct", [rand(2, 3)], bottom=["ip1"], top=["ip2"]),
            Layer("loss", "SoftmaxWithLoss", bottom=["ip2", "label"], top=["loss"])]


def fields(buf: bytes, start: int = 0, end: int | None = None):
    """(number, wire type, where the field starts, where its value starts, where it ends) of each field, in order."""
    end = len(buf) if end is None else end
    pos = start
    while pos < end:
        at = pos
        key, pos = read_varint(buf, pos)
        number, kind = key >> 3, key & 7
        if kind == 0:
            _, pos = read_varint(buf, pos)
            yield number, kind, at, at, pos
        elif kind == 2:
            size, pos = read_varint(buf, pos)
            yield number, kind, at, pos, pos + size
            pos += size
        else:
            width = 8 if kind == 1 else 4
            yield number, kind, at, pos, pos + width
            pos += width


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def named(buf: bytes, start: int, end: int, number: int) -> list:
    return [f for f in fields(buf, start, end) if f[0] == number and f[1] == 2]


def expected_bytes(buf: bytes, renames: dict, drops: set) -> bytes:
    """The net's bytes with layers dropped and renamed by hand, every other byte as it was (the test's own walk)."""
    out = b""
    for number, kind, at, start, end in fields(buf):
        if number not in (2, 100):
            out += buf[at:end]
            continue
        own = named(buf, start, end, 1 if number == 100 else 4)
        nested = named(buf, start, end, 1) if number == 2 else []
        where = own or [f for f in named(buf, nested[0][3], nested[0][4], 1)] if (own or nested) else []
        name = buf[where[-1][3]:where[-1][4]].decode() if where else None
        if name in drops:
            continue
        if name not in renames:
            out += buf[at:end]
            continue
        content = edit(buf, start, end, own[0][0] if own else None, renames[name])
        if not own:   # V0: the name is in the nested V0LayerParameter (field 1)
            v0 = nested[0]
            inner = edit(buf, v0[3], v0[4], 1, renames[name])
            content = buf[start:v0[2]] + tag_len(1, len(inner)) + inner + buf[v0[4]:end]
        out += tag_len(number, len(content)) + content
    return out


def edit(buf: bytes, start: int, end: int, number, new: str) -> bytes:
    if number is None:
        return buf[start:end]
    out = b""
    for f in fields(buf, start, end):
        out += tag_len(number, len(new)) + new.encode() if f[0] == number and f[1] == 2 else buf[f[2]:f[4]]
    return out


def tag_len(number: int, size: int) -> bytes:
    return varint(number << 3 | 2) + varint(size)


def parsed(path) -> pb.NetParameter:
    net = pb.NetParameter()
    net.ParseFromString(path.read_bytes())
    return net


@pytest.mark.parametrize("fmt", ["new", "v1", "v0"])
def test_rename_and_drop_change_only_those_bytes(tmp_path, fmt):
    layers = lenet_like() if fmt == "new" else lenet_like()[:5]
    net = write_net(tmp_path / "net.caffemodel", fmt, layers, unknown=True)
    out = tmp_path / "out.caffemodel"
    ok("edit", net, "--rename", "ip1=features", "--rename", "conv1=c1", "--drop", "ip2", "-o", out)
    expected = parsed(net)
    held = expected.layer if fmt == "new" else expected.layers
    names = [layer.name if fmt != "v0" else layer.layer.name for layer in held]
    for old, new in (("ip1", "features"), ("conv1", "c1")):
        target = held[names.index(old)]
        if fmt == "v0":
            target.layer.name = new
        else:
            target.name = new
    del held[names.index("ip2")]
    assert parsed(out) == expected
    assert out.read_bytes() == expected_bytes(net.read_bytes(), {"ip1": "features", "conv1": "c1"}, {"ip2"})
    assert [e.name for e in blobtool.open_document(out).entries] == ["c1/0", "c1/1", "features/0", "features/1"]
    # Values untouched, under their new names.
    before, after = blobtool.load_all(net), blobtool.load_all(out)
    assert after["features/0"].cpu_data().tobytes() == before["ip1/0"].cpu_data().tobytes()


def test_a_dropped_layers_readers_are_named_and_left_alone(tmp_path):
    net = write_net(tmp_path / "net.caffemodel", "new", lenet_like())
    out = tmp_path / "out.caffemodel"
    result = ok("edit", net, "--drop", "ip1", "--drop", "relu1", "-o", out)
    assert result.stderr.splitlines() == [
        # ip2 reads ip1 as relu2 (in place) left it: relu2's output, not ip1's.
        f"blobtool: warning: {net}: --drop ip1: 1 layer still read its output, left as they are (not rewired): "
        "relu2 (ip1)",
        f"blobtool: warning: {net}: --drop relu1: 1 layer still read its output, left as they are (not rewired): "
        "ip1 (conv1); relu1 worked in place on conv1, so they now read that blob as the layer before it left it"]
    kept = parsed(out)
    assert [layer.name for layer in kept.layer] == ["conv1", "relu2", "ip2", "loss"]
    assert list(kept.layer[1].bottom) == ["ip1"]   # not rewired
    # A layer whose output nobody reads goes without a word.
    assert ok("edit", net, "--drop", "loss", "-o", out).stderr == ""


def test_an_unnamed_layer_gets_its_name(tmp_path):
    net = write_net(tmp_path / "net.caffemodel", "new", [Layer("", "Convolution", [rand(2, 1, 1, 1)])])
    assert [e.name for e in blobtool.open_document(net).entries] == ["layer0/0"]
    out = tmp_path / "out.caffemodel"
    ok("edit", net, "--rename", "layer0=conv", "-o", out)
    expected = parsed(net)
    expected.layer[0].name = "conv"
    assert parsed(out) == expected
    assert [e.name for e in blobtool.open_document(out).entries] == ["conv/0"]


def test_bad_renames_and_drops(tmp_path):
    net = write_net(tmp_path / "net.caffemodel", "new", lenet_like())
    out = tmp_path / "out.caffemodel"
    assert_error(invoke("edit", net, "--drop", "fc9", "-o", out), 3,
                 f"{net}: no layer called 'fc9' (--rename, --drop); layers: conv1, relu1, ip1, relu2, ip2, loss")
    assert_error(invoke("edit", net, "--rename", "ip1=ip2", "-o", out), 2, "another layer is called 'ip2'")
    assert_error(invoke("edit", net, "--rename", "ip1", "-o", out), 2, "expected OLD=NEW")
    assert_error(invoke("edit", net, "--rename", "ip1=x", "--drop", "ip1", "-o", out), 2,
                 "both renamed and dropped")
    # Swapping two names is fine: the names after renaming are all distinct.
    ok("edit", net, "--rename", "ip1=ip2", "--rename", "ip2=ip1", "-o", out)
    assert [layer.name for layer in parsed(out).layer][2:5] == ["ip2", "relu2", "ip1"]
    assert not (tmp_path / "x.caffemodel").exists()
    blob = tmp_path / "b.pb"
    ok("convert", net, "--blob", "ip2/0", "-o", blob)
    assert_error(invoke("edit", blob, "--drop", "x", "-o", tmp_path / "c.pb"), 2, "change a net's layers")


def test_an_hdf5_net_and_a_real_process(tmp_path):
    h5 = write_h5(tmp_path / "n.caffemodel.h5", h5_net_bytes([("conv1", [rand(2, 1, 3, 3)]), ("ip1", [rand(3, 4)])]))
    out = tmp_path / "out.caffemodel.h5"
    result = run_blobtool("edit", h5, "--rename", "ip1=head", "--drop", "conv1", "-o", out, text=True)
    assert (result.returncode, result.stderr) == (0, "")
    import h5py

    with h5py.File(out, "r") as f:
        assert list(f["data"]) == ["head"]
    assert blobtool.load_all(out)["head/0"].cpu_data().tobytes() == blobtool.load_all(h5)["ip1/0"].cpu_data().tobytes()


def test_into_a_renamed_template(tmp_path):
    net = write_net(tmp_path / "net.caffemodel", "new", lenet_like())
    st = tmp_path / "v.safetensors"
    ok("convert", net, "-o", st)
    out = tmp_path / "out.caffemodel"
    # The template edited first: a dropped layer needs no value, a renamed one takes its new name's.
    edited = tmp_path / "edited.caffemodel"
    ok("edit", net, "--drop", "ip2", "-o", edited)
    result = invoke("transplant", st, edited, "-o", out)
    assert_error(result, 3, "unexpected 1 (ip2/0)", warnings=True)
    ok("transplant", st, edited, "--partial", "-o", out)
    assert [layer.name for layer in parsed(out).layer] == ["conv1", "relu1", "ip1", "relu2", "loss"]
    # transplant writes the template as it is: editing is edit's.
    result = invoke("transplant", st, net, "--drop", "ip2", "-o", out)
    assert_usage(result, "transplant", "--drop is edit's now: blobtool edit NET -o OUT --drop LAYER")


def test_real_lenet_keeps_every_other_byte(realworld, tmp_path):
    src = realworld / "lenet_iter_10000.caffemodel"
    out = tmp_path / "out.caffemodel"
    ok("edit", src, "--rename", "conv1=first", "--drop", "ip1", "-o", out)
    expected = parsed(src)
    expected.layer[1].name = "first"
    del expected.layer[5]
    assert parsed(out) == expected
    assert out.read_bytes() == expected_bytes(src.read_bytes(), {"conv1": "first"}, {"ip1"})


def test_a_definitions_layers_renamed_and_dropped(tmp_path):
    net = write_net(tmp_path / "net.caffemodel", "new", lenet_like())
    text, npz = tmp_path / "net.prototxt", tmp_path / "net.npz"
    ok("definition", net, "-o", text)
    ok("convert", net, "-o", npz)
    out = tmp_path / "out.caffemodel"
    ok("edit", text, "--rename", "ip1=features", "--drop", "loss", "-o", out)
    assert [layer.name for layer in parsed(out).layer] == ["conv1", "relu1", "features", "relu2", "ip2"]
    # As a template, edited first: the values are matched under the new names. (ip2 was built without
    # its bias, which the definition, bias_term true by default, asks for.)
    edited, edited_text = tmp_path / "edited.caffemodel", tmp_path / "edited.prototxt"
    ok("edit", text, "--rename", "ip1=features", "-o", edited)
    ok("definition", edited, "-o", edited_text)
    line = assert_error(invoke("transplant", npz, edited_text, "-o", out), 3,
                        "missing 3 (features/0, features/1, ip2/1); unexpected 2 (ip1/0, ip1/1)")
    assert "every blob needs one" in line
    arrays = dict(np.load(npz))
    arrays["features/0"], arrays["features/1"] = arrays.pop("ip1/0"), arrays.pop("ip1/1")
    arrays["ip2/1"] = rand(2)
    np.savez(tmp_path / "renamed.npz", **arrays)
    ok("edit", text, "--rename", "ip1=features", "--drop", "loss", "-o", edited)
    ok("definition", edited, "-o", edited_text)
    ok("transplant", tmp_path / "renamed.npz", edited_text, "-o", out)
    assert blobtool.load_all(out)["features/0"].cpu_data().tobytes() == arrays["features/0"].tobytes()
    assert [layer.name for layer in parsed(out).layer][-1] == "ip2"
    result = invoke("edit", text, "--drop", "loss", "-o", tmp_path / "x.prototxt")
    assert_usage(result, "edit", "blobtool definition NET -o")


# -- names that are not UTF-8 -------------------------------------------------------------------

def refuses_bytes_that_are_not_utf8() -> bool:
    """Whether this protobuf runtime refuses a string field that is not UTF-8 (the pure-Python one, 3.20, does)."""
    try:
        pb.NetParameter().ParseFromString(b"\x0a\x01\xff")
    except Exception:  # noqa: BLE001  its DecodeError, or a UnicodeDecodeError from older runtimes
        return True
    return False


def raw_net(path, names: list):
    """A net of Convolution layers named by the bytes in `names`, each with one blob, written by hand."""
    from builders import blob_bytes, len_field

    body = len_field(1, b"n")
    for i, name in enumerate(names):
        layer = (len_field(1, name) + len_field(2, b"Convolution") + len_field(3, b"data")
                 + len_field(4, b"t%d" % i) + len_field(7, blob_bytes(np.full((2, 1, 1, 1), i, np.float32))))
        body += len_field(100, layer)
    path.write_bytes(body)
    return path


def assert_refused_by_protobuf(result, out) -> None:
    """protobuf's pure-Python runtime refuses the input's name at parse: so does blobtool (exit 3, one line)."""
    assert result.returncode == 3 and "invalid LayerParameter fields" in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1 and not out.exists()


def test_options_given_bytes_that_are_not_utf8_say_so_in_one_line(tmp_path):
    # A command line's bytes that are not UTF-8 reach Python as lone surrogates ("\udcff"):
    # a new name of them is refused (a layer's name is UTF-8), a name looked for is shown as listed.
    net = write_net(tmp_path / "net.caffemodel", "new", lenet_like())
    out = tmp_path / "out.caffemodel"
    odd = "a\udcff"
    cases = [(("edit", net, "--rename", f"conv1={odd}"), 2,
              "--rename 'conv1=a\\xff': the new name 'a\\xff' is not UTF-8 text"),
             (("edit", net, "--rename", f"{odd}=x"), 3, "no layer called 'a\\xff'"),
             (("edit", net, "--drop", odd), 3, "no layer called 'a\\xff'"),
             (("convert", net, "--blob", odd), 3, "--blob 'a\\xff' selects nothing"),
             (("transplant", net, net, "--add-prefix", odd), 3, "unexpected 5 (a\\xffconv1/0,")]
    for args, code, fragment in cases:
        result = run_blobtool(*args, "-o", out, text=True)
        assert result.returncode == code, (args, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in result.stderr, (args, lines)
        assert not out.exists()


def test_a_layer_named_by_bytes_that_are_not_utf8_is_named_as_listed_or_by_those_bytes(tmp_path):
    net = raw_net(tmp_path / "odd.caffemodel", [b"b\xff1", b"c1"])
    out = tmp_path / "out.caffemodel"
    result = run_blobtool("edit", net, "--rename", "b\\xff1=first", "-o", out, text=True)
    if refuses_bytes_that_are_not_utf8():
        return assert_refused_by_protobuf(result, out)
    assert (result.returncode, result.stderr) == (0, "")
    assert [layer.name for layer in parsed(out).layer] == ["first", "c1"]
    assert "b\\xff1" in ok("info", "--layers", net).stdout   # the form given above: as listed
    # The bytes themselves, as a command line hands them over.
    ok("edit", net, "--rename", "b\udcff1=first", "-o", out)
    assert [layer.name for layer in parsed(out).layer] == ["first", "c1"]
    assert out.read_bytes() == raw_net(tmp_path / "expected.caffemodel", [b"first", b"c1"]).read_bytes()
    ok("edit", net, "--drop", "b\udcff1", "-o", out)
    assert [layer.name for layer in parsed(out).layer] == ["c1"]
    result = ok("convert", net, "--blob", "b\udcff1/0", "-o", tmp_path / "b.npz")
    assert list(np.load(tmp_path / "b.npz")) == ["b\\xff1/0"]
    assert_error(invoke("edit", net, "--rename", "b\udcff1=x", "--drop", "b\\xff1", "-o", out), 2,
                 "layer 'b\\xff1' is both renamed and dropped")


def test_bytes_that_could_name_two_layers_are_refused(tmp_path):
    # The first layer is named by the four characters b \ x f f 1, the second by the byte 0xff: both list
    # as b\xff1 (the second as b\xff1#2), so the byte given on a command line is ambiguous.
    net = raw_net(tmp_path / "odd.caffemodel", [b"b\\xff1", b"b\xff1"])
    out = tmp_path / "out.caffemodel"
    result = run_blobtool("edit", net, "--drop", "b\udcff1", "-o", out, text=True)
    if refuses_bytes_that_are_not_utf8():
        return assert_refused_by_protobuf(result, out)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "could name any of the 2 layers listed as b\\xff1, b\\xff1#2" in result.stderr and not out.exists()
    ok("edit", net, "--drop", "b\\xff1#2", "-o", out)
    assert [layer.name for layer in parsed(out).layer] == ["b\\xff1"]


def test_a_prefix_of_bytes_that_are_not_utf8(tmp_path):
    values = raw_net(tmp_path / "values.caffemodel", [b"\xffconv1", b"\xffconv2"])
    template = raw_net(tmp_path / "template.caffemodel", [b"conv1", b"conv2"])
    out = tmp_path / "out.caffemodel"
    result = run_blobtool("transplant", values, template, "--strip-prefix", "\udcff", "-o", out, text=True)
    if refuses_bytes_that_are_not_utf8():
        return assert_refused_by_protobuf(result, out)
    assert (result.returncode, result.stderr) == (0, "")
    assert blobtool.load_all(out)["conv2/0"].cpu_data().tolist() == [1, 1]
