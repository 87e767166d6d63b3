"""Containers: .caffemodel (new, V1 and V0 layers), .solverstate, BlobProtoVector, and Caffe's forks.

Every input here is made in the test: the containers with the protobuf
library (plus hand-written unknown fields), the fork encodings (NVIDIA Caffe's
raw_data, ditcaffe's half_data) byte by byte, all with tests/helpers/builders.py. The protobuf
library is the oracle for what a written file holds, numpy for the numbers.
The real caffemodel and solverstate that Caffe wrote are read from
../shared/realworld (skipped with a reason where that folder is absent).
"""

from __future__ import annotations

import gzip
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blobtool
from blobtool.formats.caffe import wire
from blobtool._pb import blobtool_caffe_pb2 as pb
from blobtool.formats import open_document
from blobtool.errors import BlobToolError, FormatError
from builders import (LAYER_UNKNOWN_HEAD, LAYER_UNKNOWN_TAIL, NET_UNKNOWN, Layer, blob_bytes, blob_proto,
                      half_blob_bytes, layer_bytes, len_field, net_bytes, raw_blob_bytes, signed_values,
                      ternary_blob_bytes, ternary_fork_fields, varint_field, write_net, write_npy, write_npz,
                      write_solverstate, write_vector)
import runner
from runner import invoke, ok, one_json

FORMATS = ("new", "v1", "v0")

RNG = np.random.default_rng(20240611)


@pytest.fixture(autouse=True)
def _fresh_rng():
    """Each test draws the same values whatever ran before it (hypothesis draws a varying number)."""
    global RNG
    RNG = np.random.default_rng(20240611)


# -- running the command ---------------------------------------------------------

def assert_error(result, code: int, *fragments) -> str:
    """Exit `code` with one 'blobtool: ...' error line (after any warnings) and no traceback."""
    return runner.assert_error(result, code, *fragments, warnings=True)


# -- making blobs ---------------------------------------------------------------------

def values(shape, dtype=np.float32) -> np.ndarray:
    """Distinct signed values with no exact binary sum."""
    return signed_values(RNG, shape, dtype)


def proto_arrays(proto: pb.BlobProto):
    """(shape, data, diff) of a BlobProto by Caffe's FromProto rules, via the protobuf library."""
    if any(proto.HasField(f) for f in ("num", "channels", "height", "width")):
        shape = (proto.num, proto.channels, proto.height, proto.width)
    else:
        shape = tuple(proto.shape.dim)
    data = np.array(proto.double_data, np.float64) if len(proto.double_data) else np.array(proto.data, np.float32)
    diff = np.array(proto.double_diff, np.float64) if len(proto.double_diff) else np.array(proto.diff, np.float32)
    return shape, data.reshape(shape), (diff.reshape(shape) if diff.size else None)


# -- making containers ---------------------------------------------------------------

def lenet_layers(legacy=False, double=False, diff=False) -> list:
    def blobs(*shapes):
        arrays = [values(s, np.float64 if double else np.float32) for s in shapes]
        return arrays, ([values(s) for s in shapes] if diff else None)

    layers = []
    for name, type_, shapes in (("data", "Data", ()), ("conv1", "Convolution", ((4, 1, 3, 3), (4,))),
                                ("pool1", "Pooling", ()), ("ip1", "InnerProduct", ((5, 16), (5,))),
                                ("relu1", "ReLU", ()), ("ip2", "InnerProduct", ((3, 5), (3,))),
                                ("loss", "SoftmaxWithLoss", ())):
        arrays, diffs = blobs(*shapes)
        layers.append(Layer(name, type_, arrays, diffs, double=double, legacy=legacy))
    return layers


LENET_NAMES = ["conv1/0", "conv1/1", "ip1/0", "ip1/1", "ip2/0", "ip2/1"]


def net_file(path: Path, fmt: str = "new", layers=None, **kw) -> tuple[Path, list]:
    """A net file of `layers` (LeNet-like ones by default) in format `fmt`; the path and the layers."""
    layers = lenet_layers() if layers is None else layers
    return write_net(path, fmt, layers, **kw), layers


def parse_net(raw: bytes) -> pb.NetParameter:
    net = pb.NetParameter()
    net.ParseFromString(raw)
    return net


def oracle_layer_names(names: list) -> list:
    """The README's naming rule, stated directly: the first bearer keeps a name; an unnamed layer is
    "layer<k>" if free; any other takes "#n", the smallest n from its occurrence (2 at least) that no
    layer bears and none was given."""
    final = []
    for k, name in enumerate(names):
        base = name or f"layer{k}"
        if base not in final and (name or base not in names):
            final.append(base)
            continue
        n = max(2, names[:k].count(name) + 1) if name else 2
        while f"{base}#{n}" in names or f"{base}#{n}" in final:
            n += 1
        final.append(f"{base}#{n}")
    return final


def oracle_net_blobs(net: pb.NetParameter) -> list:
    """[(name, layer name, BlobProto message)] in file order, named by the README's rules."""
    layers = list(net.layer) if len(net.layer) else list(net.layers)
    names, blob_lists = [], []
    for layer in layers:
        if isinstance(layer, pb.LayerParameter):
            names.append(layer.name)
            blob_lists.append(list(layer.blobs))
        else:
            names.append(layer.name or layer.layer.name)
            blob_lists.append(list(layer.blobs) + list(layer.layer.blobs))
    out = []
    for name, blobs in zip(oracle_layer_names(names), blob_lists):
        out += [(f"{name}/{i}", name, b) for i, b in enumerate(blobs)]
    return out


def oracle_blobs(raw: bytes, kind: str) -> list:
    """[(name, BlobProto message)] of a container, read by the protobuf library."""
    msg = message_of(raw, kind)
    return [(n, b) for n, _, b in _oracle(msg, kind)]


def message_of(raw: bytes, kind: str):
    msg = {"net": pb.NetParameter, "solverstate": pb.SolverState, "vector": pb.BlobProtoVector,
           "blob": pb.BlobProto}[kind]()
    msg.ParseFromString(raw)
    return msg


def _oracle(msg, kind):
    if kind == "net":
        return oracle_net_blobs(msg)
    if kind == "solverstate":
        return [(f"history/{i}", None, b) for i, b in enumerate(msg.history)]
    if kind == "vector":
        return [(str(i), None, b) for i, b in enumerate(msg.blobs)]
    return [("0", None, msg)]


def cleared(raw: bytes, kind: str, names) -> bytes:
    """The container re-serialized by protobuf with the named blobs emptied: what must not change."""
    msg = message_of(raw, kind)
    for name, _, blob in _oracle(msg, kind):
        if name in names:
            blob.Clear()
    return msg.SerializeToString()


def fields_of(raw: bytes) -> list:
    return [(f.number, f.wire_type) for f in wire.iter_fields(raw, 0, len(raw))]


# -- fork encodings, by hand ------------------------------------------------------------

# =====================================================================================
# Kinds, sniffed from the bytes
# =====================================================================================

def _kind_cases(tmp: Path) -> dict:
    """{path: expected kind}, each file named with a misleading extension."""
    arr = values((2, 3))
    cases = {}
    p = tmp / "blob.caffemodel"
    p.write_bytes(blob_bytes(arr))
    cases[p] = "blob"
    p = tmp / "legacy_blob.solverstate"
    p.write_bytes(blob_bytes(arr, arr, layout="legacy"))
    cases[p] = "blob"
    p = tmp / "double_blob.npy"
    p.write_bytes(blob_bytes(arr, double=True))
    cases[p] = "blob"
    cases[write_vector(tmp / "vector.caffemodel", [arr, values((4,))])] = "vector"
    cases[write_vector(tmp / "vector1.binaryproto", [arr])] = "vector"
    for fmt in FORMATS:
        cases[net_file(tmp / f"net_{fmt}.binaryproto", fmt)[0]] = "net"
        cases[net_file(tmp / f"net_{fmt}_unknown.pb", fmt, unknown=True)[0]] = "net"
        cases[net_file(tmp / f"net_{fmt}_noname.pb", fmt, name=None)[0]] = "net"
    cases[write_solverstate(tmp / "state.caffemodel", [arr, values((3,))])] = "solverstate"
    cases[write_solverstate(tmp / "state_unknown.pb", [arr], unknown=True)] = "solverstate"
    cases[write_npy(tmp / "array.pb", arr)] = "npy"
    cases[write_npz(tmp / "arrays.caffemodel", {"a": arr, "b": values((5,))})] = "npz"
    return cases


def test_kind_is_sniffed_from_the_bytes_not_the_extension(tmp_path):
    for path, kind in _kind_cases(tmp_path).items():
        assert open_document(path).kind == kind, path.name
        record = one_json(ok("info", "--json", path))
        assert record["kind"] == kind, path.name


def _net_header_fields() -> bytes:
    """NetParameter's input (3), input_shape (8), input_dim (4), force_backward (5) and state (6)."""
    head = pb.NetParameter(name="deploy")
    head.input.append("data")
    head.input_shape.add().dim.extend([1, 3, 224, 224])
    head.input_dim.extend([1, 3, 224, 224])
    head.force_backward = True
    state = varint_field(1, 1) + varint_field(2, 0) + len_field(3, b"deploy")  # NetState phase/level/stage
    return head.SerializeToString() + len_field(6, state)


@pytest.mark.parametrize("fmt", FORMATS)
def test_net_with_state_input_shape_input_force_backward_is_a_net(tmp_path, fmt):
    header = _net_header_fields()
    path, _ = net_file(tmp_path / "deploy.caffemodel", fmt, name=None, extra_top=header)
    doc = open_document(path)
    assert doc.kind == "net"
    assert doc.names() == LENET_NAMES
    assert doc.meta["name"] == "deploy"
    # The same fields after the layers, as a hand-edited file may have them.
    raw = net_bytes(fmt, lenet_layers(), name=None) + header
    (tmp_path / "late.caffemodel").write_bytes(raw)
    assert open_document(tmp_path / "late.caffemodel").kind == "net"


def test_net_without_layers_is_still_a_net(tmp_path):
    # A deploy header alone: input_shape's and state's bytes look like packed
    # payloads, but name, input and force_backward cannot be in a BlobProto.
    path = tmp_path / "header_only.pb"
    path.write_bytes(_net_header_fields())
    record = one_json(ok("info", "--json", path))
    assert record["kind"] == "net" and record["name"] == "deploy" and record["blobs"] == []


def test_v0_net_without_a_name_is_a_net(tmp_path):
    # Caffe's oldest format: `layers { layer { name type blobs } bottom top }`,
    # the V1 message holding nothing but the nested V0 layer and connections.
    path, layers = net_file(tmp_path / "v0.caffemodel", "v0", name=None)
    doc = open_document(path)
    assert doc.kind == "net"
    assert doc.names() == LENET_NAMES
    np.testing.assert_array_equal(doc.entries[0].blob().cpu_data().reshape(4, 1, 3, 3), layers[1].blobs[0])


def test_kind_override(tmp_path):
    # A SolverState with only `iter` is one varint field 1: as a BlobProto that
    # is `num`, and the sniffer takes it for a blob. --kind says what it is.
    path = tmp_path / "state.solverstate"
    path.write_bytes(pb.SolverState(iter=5).SerializeToString())
    assert one_json(ok("info", "--json", path))["kind"] == "blob"
    record = one_json(ok("info", "--json", "--kind", "solverstate", path))
    assert record["kind"] == "solverstate" and record["iter"] == 5 and record["blobs"] == []
    # A fork's solver state with an extra field numbered like a BlobProto field
    # (5: a varint) reads as a solver state when told so, history and all.
    state = pb.SolverState(iter=9, learned_net="x.caffemodel")
    state.history.append(blob_proto(values((2, 2))))
    (tmp_path / "fork.solverstate").write_bytes(state.SerializeToString() + varint_field(5, 3))
    record = one_json(ok("info", "--json", "--kind", "solverstate", tmp_path / "fork.solverstate"))
    assert record["iter"] == 9 and [b["name"] for b in record["blobs"]] == ["history/0"]
    # The override applies to every command, not just info.
    net, _ = net_file(tmp_path / "n.bin")
    record = one_json(ok("norm", "--json", "--kind", "net", net))
    assert [b["name"] for b in record["blobs"]] == LENET_NAMES
    # And the library takes it too.
    assert list(blobtool.load_all(net, kind="net")) == LENET_NAMES
    # A wrong override is bad input (exit 3), not a crash: the net's name is no BlobProto.
    assert_error(invoke("info", "--kind", "vector", net), 3, str(net))
    result = invoke("info", "--kind", "caffemodel", net)
    assert result.exit_code == 2 and "caffemodel" in result.stderr


NOT_CAFFE = [
    # (name, bytes, fragments of the message)
    ("weights.caffemodel.gz", lambda raw: gzip.compress(raw), ("gzip", "gunzip")),
    ("._weights.caffemodel", lambda raw: b"\x00\x05\x16\x07" + b"\x00\x02\x00\x00Mac OS X        " + raw,
     ("AppleDouble", "'._'")),
]


@pytest.mark.parametrize("name,make,fragments", NOT_CAFFE, ids=[c[0] for c in NOT_CAFFE])
def test_not_a_caffe_file_says_what_it_looks_like(tmp_path, name, make, fragments):
    path = tmp_path / name
    path.write_bytes(make(net_bytes("new", lenet_layers())))
    for command in ("info", "norm"):
        assert_error(invoke(command, path), 3, str(path), *fragments)
    assert_error(invoke("convert", path, "-o", tmp_path / "out.caffemodel"), 3, *fragments)
    assert not (tmp_path / "out.caffemodel").exists()
    with pytest.raises(FormatError, match="looks like"):
        blobtool.load_all(path)


# =====================================================================================
# Names
# =====================================================================================

def test_names_of_blob_vector_and_solverstate(tmp_path):
    a, b, c = values((2, 3)), values((4,)), values((1, 2, 2))
    (tmp_path / "b.pb").write_bytes(blob_bytes(a))
    assert open_document(tmp_path / "b.pb").names() == ["0"]
    assert open_document(write_vector(tmp_path / "v.pb", [a, b, c])).names() == ["0", "1", "2"]
    doc = open_document(write_solverstate(tmp_path / "s.solverstate", [a, b, c], iter_=777))
    assert doc.names() == ["history/0", "history/1", "history/2"]
    record = one_json(ok("info", "--json", tmp_path / "s.solverstate"))
    assert record["iter"] == 777 and record["kind"] == "solverstate"
    assert [x["shape"] for x in record["blobs"]] == [[2, 3], [4], [1, 2, 2]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_net_names_types_and_order(tmp_path, fmt):
    path, layers = net_file(tmp_path / "net.caffemodel", fmt, name="LeNetish", unknown=True)
    record = one_json(ok("info", "--json", path))
    assert record["kind"] == "net" and record["name"] == "LeNetish"
    assert [b["name"] for b in record["blobs"]] == LENET_NAMES
    assert [b["layer"] for b in record["blobs"]] == ["conv1", "conv1", "ip1", "ip1", "ip2", "ip2"]
    expected_types = {"new": ["Convolution"] * 2 + ["InnerProduct"] * 4,
                      "v1": ["Convolution"] * 2 + ["InnerProduct"] * 4,  # from the enum
                      "v0": ["convolution"] * 2 + ["innerproduct"] * 4}[fmt]  # V0 strings as written
    assert [b["type"] for b in record["blobs"]] == expected_types
    assert [b["shape"] for b in record["blobs"]] == [[4, 1, 3, 3], [4], [5, 16], [5], [3, 5], [3]]
    # The text table carries the same layers and types.
    text = ok("info", path).stdout
    for layer, type_ in zip([b["layer"] for b in record["blobs"]], expected_types):
        assert layer in text and type_ in text


def test_v1_enum_types_become_caffe_type_strings(tmp_path):
    layers = [Layer(name, type_, [values((2,))]) for name, type_ in
              (("c", "Convolution"), ("i", "InnerProduct"), ("s", "SoftmaxWithLoss"), ("r", "ReLU"),
               ("p", "Pooling"), ("d", "Data"))]
    path, _ = net_file(tmp_path / "v1.caffemodel", "v1", layers)
    record = one_json(ok("info", "--json", path))
    assert {b["layer"]: b["type"] for b in record["blobs"]} == {l.name: l.type for l in layers}


@pytest.mark.parametrize("fmt", FORMATS)
def test_unnamed_and_duplicate_layers(tmp_path, fmt):
    layers = [Layer("conv", "Convolution", [values((2, 2)), values((2,))]),
              Layer("", "ReLU", []),
              Layer("", "InnerProduct", [values((3,))]),
              Layer("conv", "Convolution", [values((1, 2))]),
              Layer("conv", "Convolution", [values((5,))]),
              Layer("", "InnerProduct", [values((4,))])]
    path, _ = net_file(tmp_path / "net.caffemodel", fmt, layers)
    doc = open_document(path)
    expected = ["conv/0", "conv/1", "layer2/0", "conv#2/0", "conv#3/0", "layer5/0"]
    assert doc.names() == expected
    assert [e.name for e in doc.entries] == [n for n, _, _ in oracle_net_blobs(parse_net(path.read_bytes()))]
    assert [e.shape for e in doc.entries] == [(2, 2), (2,), (3,), (1, 2), (5,), (4,)]
    # A bare layer name selects that layer only; the duplicates have their own names.
    record = one_json(ok("info", "--json", "--blob", "conv", path))
    assert [b["name"] for b in record["blobs"]] == ["conv/0", "conv/1"]
    record = one_json(ok("info", "--json", "--blob", "conv#2", path))
    assert [b["name"] for b in record["blobs"]] == ["conv#2/0"]


# Names of layers, as hypothesis draws them: some empty, some repeated, some
# that blobtool's own suffixes or an unnamed layer's name would produce.
_layer_names = st.lists(st.sampled_from(["", "conv", "ip", "a/b", "x y", "relu1", "ümlaut", "conv#2", "conv#3",
                                         "layer1", "layer2#2", "ip/0"]), min_size=1, max_size=6)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(FORMATS), names=_layer_names, counts=st.lists(st.integers(0, 3), min_size=6, max_size=6),
       unknown=st.booleans())
def test_names_match_the_protobuf_oracle(fmt, names, counts, unknown):
    layers = [Layer(n, "InnerProduct", [values((k + 1, 2)) for k in range(c)]) for n, c in zip(names, counts)]
    raw = net_bytes(fmt, layers, unknown=unknown)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "net.caffemodel"
        path.write_bytes(raw)
        doc = open_document(path)
        oracle = oracle_net_blobs(parse_net(raw))
        # Every layer has a type, so even a net whose layers hold no blobs is a net.
        assert doc.kind == "net"
        assert [(e.name, e.layer) for e in doc.entries] == [(n, l) for n, l, _ in oracle]
        for entry, (_, _, proto) in zip(doc.entries, oracle):
            shape, data, _ = proto_arrays(proto)
            np.testing.assert_array_equal(entry.blob().cpu_data().reshape(shape), data)


def test_layer_names_that_collide_with_made_up_ones_get_distinct_blob_names(tmp_path):
    # a, a, a#2 once gave a/0, a#2/0, a#2/0: scale left one unscaled, .npz kept one.
    layers = [Layer("a", "InnerProduct", [values((2,))]), Layer("a", "InnerProduct", [values((3, 2))]),
              Layer("a#2", "InnerProduct", [values((4,))]), Layer("", "ReLU", [values((5,))]),
              Layer("layer3", "ReLU", [values((6,))])]
    path, _ = net_file(tmp_path / "net.caffemodel", "new", layers)
    names = ["a/0", "a#3/0", "a#2/0", "layer3#2/0", "layer3/0"]
    assert open_document(path).names() == names
    record = one_json(ok("info", "--json", path))
    assert [(b["name"], b["layer"], b["shape"]) for b in record["blobs"]] == [
        ("a/0", "a", [2]), ("a#3/0", "a#3", [3, 2]), ("a#2/0", "a#2", [4]), ("layer3#2/0", "layer3#2", [5]),
        ("layer3/0", "layer3", [6])]
    # Each blob on its own: scaled, extracted, compared, shown.
    out = tmp_path / "scaled.caffemodel"
    ok("scale", path, "2", "--blob", "a#2", "-o", out)
    before, after = blobtool.load_all(path), blobtool.load_all(out)
    for name in names:
        factor = 2 if name == "a#2/0" else 1
        np.testing.assert_array_equal(after[name].cpu_data(), before[name].cpu_data() * factor)
    npz = tmp_path / "all.npz"
    ok("convert", path, "-o", npz)
    with np.load(npz) as arrays:
        assert sorted(arrays.files) == sorted(names)
        for name in names:
            np.testing.assert_array_equal(arrays[name].reshape(-1), before[name].cpu_data())
    assert invoke("compare", path, out).exit_code == 1
    assert invoke("compare", path, out, "--blob", "a", "--blob", "a#3", "--blob", "layer3*").exit_code == 0
    assert "(3, 2)" in ok("show", path, "--blob", "a#3/0", "--width", "40").stdout


def test_unique_names_keep_names_that_do_not_collide():
    from blobtool.formats import unique_names
    assert unique_names(["conv1", "", "ip1", "conv1"]) == ["conv1", "layer1", "ip1", "conv1#2"]
    assert unique_names(["a", "a", "a#2", "a"]) == ["a", "a#3", "a#2", "a#4"]
    assert unique_names(["a#2", "a", "a"]) == ["a#2", "a", "a#3"]
    assert unique_names(["", "layer0", "layer0"]) == ["layer0#2", "layer0", "layer0#3"]


# =====================================================================================
# --blob PATTERN
# =====================================================================================

@pytest.mark.parametrize("fmt", FORMATS)
def test_blob_patterns(tmp_path, fmt):
    path, _ = net_file(tmp_path / "net.caffemodel", fmt)

    def selected(*patterns):
        args = [a for p in patterns for a in ("--blob", p)]
        return [b["name"] for b in one_json(ok("info", "--json", *args, path))["blobs"]]

    assert selected("ip1/1") == ["ip1/1"]
    assert selected("conv*/0") == ["conv1/0"]
    assert selected("ip*") == ["ip1/0", "ip1/1", "ip2/0", "ip2/1"]
    assert selected("*/1") == ["conv1/1", "ip1/1", "ip2/1"]
    assert selected("ip2") == ["ip2/0", "ip2/1"]
    # Repeatable; the union in file order, each blob once.
    assert selected("ip2/1", "conv1", "conv1/0") == ["conv1/0", "conv1/1", "ip2/1"]
    # Selection applies to norm too.
    record = one_json(ok("norm", "--json", "--blob", "ip2", path))
    assert [b["name"] for b in record["blobs"]] == ["ip2/0", "ip2/1"]


def test_an_exact_name_selects_only_that_blob(tmp_path):
    # fc[relu]/0 as a glob matches fcr/0; x/1 is blob 1 of x and the name of a layer.
    layers = [Layer("fc[relu]", "InnerProduct", [values((2,))]), Layer("fcr", "InnerProduct", [values((3,))]),
              Layer("x", "InnerProduct", [values((4,)), values((5,))]), Layer("x/1", "ReLU", [values((6,))])]
    path, _ = net_file(tmp_path / "net.caffemodel", "new", layers)

    def selected(*patterns):
        args = [a for p in patterns for a in ("--blob", p)]
        return [b["name"] for b in one_json(ok("info", "--json", *args, path))["blobs"]]

    assert selected("fc[relu]/0") == ["fc[relu]/0"]
    assert selected("fc[relu]") == ["fc[relu]/0"]       # a layer's exact name
    assert selected("x/1") == ["x/1"]
    assert selected("x/1/0") == ["x/1/0"]
    assert selected("x/1/*") == ["x/1/0"]                # no exact name: a glob
    assert selected("fc[rt]/0") == ["fcr/0"]
    assert selected("x") == ["x/0", "x/1"]
    # scale changes exactly the blob named, nothing a glob reading would add.
    out = tmp_path / "scaled.caffemodel"
    ok("scale", path, "10", "--blob", "fc[relu]/0", "--blob", "x/1", "-o", out)
    before, after = blobtool.load_all(path), blobtool.load_all(out)
    for name in before:
        factor = 10 if name in ("fc[relu]/0", "x/1") else 1
        np.testing.assert_array_equal(after[name].cpu_data(), before[name].cpu_data() * factor)


def test_blob_pattern_that_selects_nothing_lists_the_names(tmp_path):
    path, _ = net_file(tmp_path / "net.caffemodel")
    for command in (("info",), ("norm",), ("convert", "-o", tmp_path / "o.caffemodel"),
                    ("scale", "2", "-o", tmp_path / "o.caffemodel")):
        result = invoke(command[0], path, "--blob", "conv3", *command[1:])
        line = assert_error(result, 3, "conv3", "selects nothing")
        for name in LENET_NAMES:
            assert name in line
    assert not (tmp_path / "o.caffemodel").exists()
    # One good pattern does not excuse a bad one.
    assert_error(invoke("info", path, "--blob", "conv1", "--blob", "pool1"), 3, "pool1")
    # So does a name beyond the last blob.
    state = write_solverstate(tmp_path / "s.solverstate", [values((2,))])
    assert_error(invoke("norm", state, "--blob", "history/1"), 3, "history/0")


# =====================================================================================
# Commands on containers
# =====================================================================================

@pytest.mark.parametrize("fmt", FORMATS)
def test_info_reads_no_payload(tmp_path, fmt):
    # A blob whose shape says 12 values but whose data holds 3: info lists
    # every blob (reading no value: the count is the payload's length) and
    # flags this one, exit 3; reading the values fails.
    bad = blob_proto([1.0, 2.0, 3.0], shape=[3, 4])
    layers = lenet_layers()
    path = tmp_path / "bad.caffemodel"
    raw = net_bytes(fmt, layers)
    # Put the damaged blob in a layer of its own at the end.
    number, body = layer_bytes(fmt, Layer("broken", "InnerProduct", []), unknown=False)
    if fmt == "new":
        body += len_field(7, bad.SerializeToString())
    elif fmt == "v1":
        body += len_field(6, bad.SerializeToString())
    else:
        v0 = pb.V0LayerParameter(name="broken", type="innerproduct")
        v0.blobs.append(bad)
        body = len_field(1, v0.SerializeToString())
    path.write_bytes(raw + len_field(number, body))
    result = invoke("info", "--json", path)
    assert result.exit_code == 3, (result.exit_code, result.stderr)
    assert result.stderr == (f"blobtool: {path}: blob broken/0: shape (3, 4) needs 12 values, "
                             "but field 5 (data) holds 3\n")
    record = one_json(result)
    assert record["blobs"][-1]["name"] == "broken/0"
    assert record["blobs"][-1]["shape"] == [3, 4] and record["blobs"][-1]["count"] == 12
    assert record["invalid"] == [{"name": "broken/0", "shape": [3, 4], "count": 12, "which": "data",
                                  "field": "field 5 (data)", "values": 3}]
    assert [b["name"] for b in record["blobs"][:-1]] == LENET_NAMES
    assert_error(invoke("norm", path), 3, "field 5 (data)", "12")
    # Selecting around it works.
    ok("norm", path, "--blob", "conv1")
    assert "invalid" not in one_json(ok("info", "--json", path, "--blob", "conv1"))


def _norms(arr) -> tuple[float, float]:
    a = np.asarray(arr, np.float64)
    return float(np.abs(a).sum()), float((a * a).sum())


@pytest.mark.parametrize("fmt", FORMATS)
def test_norm_per_blob_and_total(tmp_path, fmt):
    layers = lenet_layers(diff=True)
    path, _ = net_file(tmp_path / "net.caffemodel", fmt, layers)
    record = one_json(ok("norm", "--json", path))
    arrays = [b for l in layers for b in l.blobs]
    diffs = [d for l in layers for d in l.diffs]
    assert [b["name"] for b in record["blobs"]] == LENET_NAMES
    for row, arr, diff in zip(record["blobs"], arrays, diffs):
        asum, sumsq = _norms(arr)
        assert row["data"]["asum"] == pytest.approx(asum, rel=1e-12)
        assert row["data"]["sumsq"] == pytest.approx(sumsq, rel=1e-12)
        assert row["data"]["l2"] == pytest.approx(math.sqrt(sumsq), rel=1e-12)
        dasum, dsumsq = _norms(diff)
        assert row["diff"]["asum"] == pytest.approx(dasum, rel=1e-12)
        assert row["diff"]["sumsq"] == pytest.approx(dsumsq, rel=1e-12)
        assert row["layer"] == row["name"].split("/")[0]
    total_asum = sum(_norms(a)[0] for a in arrays)
    total_sumsq = sum(_norms(a)[1] for a in arrays)
    assert record["total"]["data"]["asum"] == pytest.approx(total_asum, rel=1e-12)
    assert record["total"]["data"]["sumsq"] == pytest.approx(total_sumsq, rel=1e-12)
    assert record["total"]["diff"]["asum"] == pytest.approx(sum(_norms(d)[0] for d in diffs), rel=1e-12)
    # The total is over the selection.
    record = one_json(ok("norm", "--json", "--blob", "ip1", path))
    assert record["total"]["data"]["asum"] == pytest.approx(_norms(arrays[2])[0] + _norms(arrays[3])[0], rel=1e-12)
    text = ok("norm", path).stdout
    assert "total" in text and "ip2/1" in text


def test_norm_of_solverstate_and_vector(tmp_path):
    arrays = [values((3, 4)), values((7,))]
    for path in (write_solverstate(tmp_path / "s.solverstate", arrays), write_vector(tmp_path / "v.pb", arrays)):
        record = one_json(ok("norm", "--json", path))
        for row, arr in zip(record["blobs"], arrays):
            assert row["data"]["sumsq"] == pytest.approx(_norms(arr)[1], rel=1e-12)
        assert record["total"]["data"]["asum"] == pytest.approx(sum(_norms(a)[0] for a in arrays), rel=1e-12)
        assert record["total"]["diff"] is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_compare_matches_blobs_by_name(tmp_path, fmt):
    layers_a = lenet_layers()
    a, _ = net_file(tmp_path / "a.caffemodel", fmt, layers_a)
    # Same blobs, another order of layers: still equal (matched by name).
    same = [layers_a[0], layers_a[3], layers_a[1], layers_a[5]]
    b, _ = net_file(tmp_path / "b.caffemodel", fmt, same)
    result = invoke("compare", "--json", a, b)
    assert result.exit_code == 0, result.stderr
    assert one_json(result)["equal"] is True
    # Change ip1/0, drop ip2, add fc9.
    changed = np.array(layers_a[3].blobs[0], copy=True)
    changed[1, 2] += 0.75
    changed[4, 0] -= 0.25
    layers_b = [layers_a[1], Layer("ip1", "InnerProduct", [changed, layers_a[3].blobs[1]]),
                Layer("fc9", "InnerProduct", [values((2,))])]
    b, _ = net_file(tmp_path / "b.caffemodel", fmt, layers_b)
    result = invoke("compare", "--json", a, b)
    assert result.exit_code == 1, result.stderr
    record = one_json(result)
    assert record["equal"] is False
    rows = {r["name"]: r for r in record["blobs"]}
    assert set(rows) == set(LENET_NAMES) | {"fc9/0"}
    assert rows["conv1/0"]["equal"] and rows["ip1/1"]["equal"]
    assert rows["ip2/0"]["only_in"] == "a" and rows["ip2/1"]["only_in"] == "a" and rows["ip2/0"]["equal"] is False
    assert rows["fc9/0"]["only_in"] == "b"
    ip1 = rows["ip1/0"]
    old = layers_a[3].blobs[0].astype(np.float64)
    new = changed.astype(np.float64)
    assert ip1["equal"] is False and ip1["mismatches"] == 2
    assert ip1["max_abs"] == pytest.approx(np.abs(old - new).max(), rel=1e-6)
    assert ip1["rel_l2"] == pytest.approx(np.linalg.norm(old - new) / np.linalg.norm(new), rel=1e-6)
    assert ip1["layer"] == "ip1"
    # The human output names what changed and what is missing.
    text = invoke("compare", a, b)
    assert text.exit_code == 1
    for name in ("ip1/0", "ip2/0", "fc9/0"):
        assert name in text.stdout
    # Restricted to the unchanged blobs, the two agree.
    assert invoke("compare", a, b, "--blob", "conv1").exit_code == 0


def test_compare_solverstates_and_across_layer_formats(tmp_path):
    arrays = [values((2, 2)), values((3,))]
    s1 = write_solverstate(tmp_path / "s1.solverstate", arrays, iter_=100)
    s2 = write_solverstate(tmp_path / "s2.solverstate", [arrays[0], arrays[1] * 2], iter_=200)
    record = one_json(invoke("compare", "--json", s1, s2))
    assert [r["equal"] for r in record["blobs"]] == [True, False]
    # A V1 model and its upgrade to the new format hold the same blobs.
    layers = lenet_layers()
    v1, _ = net_file(tmp_path / "v1.caffemodel", "v1", layers)
    new, _ = net_file(tmp_path / "new.caffemodel", "new", layers, unknown=True)
    assert invoke("compare", v1, new).exit_code == 0


# -- convert, scale, update: only the selected blobs change ---------------------------

def _same_except(in_raw: bytes, out_raw: bytes, kind: str, names) -> None:
    assert cleared(in_raw, kind, names) == cleared(out_raw, kind, names)


def _container_cases(tmp: Path) -> list:
    """(path, kind) for a generated file of every kind and layer format, unknown fields included."""
    cases = []
    for fmt in FORMATS:
        cases.append((net_file(tmp / f"{fmt}.caffemodel", fmt, lenet_layers(diff=True), unknown=True)[0], "net"))
        cases.append((net_file(tmp / f"{fmt}_legacy.caffemodel", fmt, lenet_layers(legacy=True))[0], "net"))
        cases.append((net_file(tmp / f"{fmt}_double.caffemodel", fmt, lenet_layers(double=True))[0], "net"))
    state = write_solverstate(tmp / "s.solverstate", [values((2, 3)), values((4,))], unknown=True)
    cases.append((state, "solverstate"))
    cases.append((write_vector(tmp / "vectors", [values((2, 3)), values((4,))], [values((2, 3)), None]),
                  "vector"))
    return cases


def test_convert_without_changes_is_byte_identical(tmp_path):
    for path, kind in _container_cases(tmp_path):
        out = tmp_path / ("copy_" + path.name)
        ok("convert", path, "-o", out)
        assert out.read_bytes() == path.read_bytes(), path.name
        # Re-encoding selected blobs in the form they came in changes nothing either.
        ok("convert", path, "--blob", "*1", "-o", out)
        assert out.read_bytes() == path.read_bytes(), path.name
    # A blob-file name (.binaryproto) would extract one blob; --format same keeps the container.
    vec = write_vector(tmp_path / "vector.binaryproto", [values((2, 3)), values((4,))])
    ok("convert", vec, "--format", "same", "-o", tmp_path / "copy.binaryproto")
    assert (tmp_path / "copy.binaryproto").read_bytes() == vec.read_bytes()
    # And with nothing to change, the NVIDIA half form round-trips too.
    raw = net_bytes("new", [Layer("h", "InnerProduct", [])])
    number, body = layer_bytes("new", Layer("h", "InnerProduct", []), unknown=True)
    body += len_field(7, raw_blob_bytes(values((3, 2), np.float16), values((3, 2), np.float16)))
    (tmp_path / "half.caffemodel").write_bytes(raw + len_field(number, body))
    ok("convert", tmp_path / "half.caffemodel", "-o", tmp_path / "half2.caffemodel")
    assert (tmp_path / "half2.caffemodel").read_bytes() == (tmp_path / "half.caffemodel").read_bytes()


CONVERSIONS = [
    # (options, check(in proto, out proto))
    (("--double",), lambda a, b: len(b.double_data) == len(a.data) + len(a.double_data) and not len(b.data)),
    (("--float",), lambda a, b: len(b.data) == len(a.data) + len(a.double_data) and not len(b.double_data)),
    (("--legacy",), lambda a, b: b.HasField("num") and not b.HasField("shape")),
    (("--shape",), lambda a, b: b.HasField("shape") and not b.HasField("num")),
    (("--no-diff",), lambda a, b: not len(b.diff) and not len(b.double_diff)),
]


@pytest.mark.parametrize("options,check", CONVERSIONS, ids=[c[0][0] for c in CONVERSIONS])
@pytest.mark.parametrize("pattern,selected", [("conv1", ["conv1/0", "conv1/1"]), ("ip*/0", ["ip1/0", "ip2/0"])])
def test_convert_selected_blobs_leaves_every_other_byte(tmp_path, options, check, pattern, selected):
    for path, kind in _container_cases(tmp_path):
        if kind != "net":
            continue
        out = tmp_path / ("out_" + path.name)
        ok("convert", path, "--blob", pattern, *options, "-o", out)
        in_raw, out_raw = path.read_bytes(), out.read_bytes()
        _same_except(in_raw, out_raw, "net", selected)
        before = dict((n, b) for n, b in oracle_blobs(in_raw, "net"))
        after = dict((n, b) for n, b in oracle_blobs(out_raw, "net"))
        assert list(after) == list(before)
        for name in before:
            if name in selected:
                assert check(before[name], after[name]), (path.name, name, options)
                shape_a, data_a, _ = proto_arrays(before[name])
                shape_b, data_b, _ = proto_arrays(after[name])
                # --legacy pads to 4 axes; --shape keeps a legacy blob's 4 axes.
                assert (1,) * (4 - len(shape_a)) + shape_a == (1,) * (4 - len(shape_b)) + shape_b
                np.testing.assert_array_equal(data_b.astype(np.float64).ravel(),
                                              data_a.astype(data_b.dtype).astype(np.float64).ravel())
            else:
                assert after[name].SerializeToString() == before[name].SerializeToString()
    # Solver state and vector: the same property.
    state = write_solverstate(tmp_path / "st.solverstate", [values((2, 3)), values((4,))], unknown=True)
    ok("convert", state, "--blob", "history/1", *options, "-o", tmp_path / "st2.solverstate")
    _same_except(state.read_bytes(), (tmp_path / "st2.solverstate").read_bytes(), "solverstate", ["history/1"])
    vec = write_vector(tmp_path / "v.pb", [values((2, 3)), values((4,))], [values((2, 3)), values((4,))])
    ok("convert", vec, "--blob", "0", *options, "-o", tmp_path / "v2_vectors")
    _same_except(vec.read_bytes(), (tmp_path / "v2_vectors").read_bytes(), "vector", ["0"])
    written = (tmp_path / "v2_vectors").read_bytes()
    assert check(oracle_blobs(vec.read_bytes(), "vector")[0][1], oracle_blobs(written, "vector")[0][1])


def test_convert_keeps_unknown_fields_and_their_order(tmp_path):
    path, _ = net_file(tmp_path / "net.caffemodel", "new", unknown=True)
    out = tmp_path / "out.caffemodel"
    ok("convert", path, "--blob", "ip1", "--double", "-o", out)
    in_raw, out_raw = path.read_bytes(), out.read_bytes()
    # Top level: the same fields in the same order, the unknown ones byte for byte.
    assert fields_of(in_raw) == fields_of(out_raw)
    assert NET_UNKNOWN in out_raw and varint_field(4244, 3) in out_raw
    # Inside each layer: the same fields in the same order; ip1's blobs grew.
    in_layers = [f for f in wire.iter_fields(in_raw, 0, len(in_raw)) if f.number == 100]
    out_layers = [f for f in wire.iter_fields(out_raw, 0, len(out_raw)) if f.number == 100]
    assert len(in_layers) == len(out_layers) == 7
    for fi, fo in zip(in_layers, out_layers):
        assert fields_of(in_raw[fi.start:fi.end]) == fields_of(out_raw[fo.start:fo.end])
        if pb.LayerParameter.FromString(in_raw[fi.start:fi.end]).name != "ip1":
            assert in_raw[fi.start:fi.end] == out_raw[fo.start:fo.end]
        else:
            assert fo.end - fo.start > fi.end - fi.start
    assert out_raw.count(LAYER_UNKNOWN_HEAD) == in_raw.count(LAYER_UNKNOWN_HEAD) == 7
    assert out_raw.count(LAYER_UNKNOWN_TAIL) == 7


@pytest.mark.parametrize("fmt", FORMATS)
def test_scale_and_update_only_touch_selected_blobs(tmp_path, fmt):
    layers = lenet_layers(diff=True)
    path, _ = net_file(tmp_path / "net.caffemodel", fmt, layers, unknown=True)
    in_raw = path.read_bytes()
    before = dict(oracle_blobs(in_raw, "net"))

    out = tmp_path / "scaled.caffemodel"
    ok("scale", path, "0.5", "--blob", "ip2", "--diff-factor", "-2", "-o", out)
    out_raw = out.read_bytes()
    _same_except(in_raw, out_raw, "net", ["ip2/0", "ip2/1"])
    after = dict(oracle_blobs(out_raw, "net"))
    for name in ("ip2/0", "ip2/1"):
        _, data_a, diff_a = proto_arrays(before[name])
        _, data_b, diff_b = proto_arrays(after[name])
        np.testing.assert_array_equal(data_b, (data_a * np.float32(0.5)).astype(np.float32))
        np.testing.assert_array_equal(diff_b, (diff_a * np.float32(-2)).astype(np.float32))
    for name in ("conv1/0", "ip1/1"):
        assert after[name].SerializeToString() == before[name].SerializeToString()

    out = tmp_path / "updated.caffemodel"
    ok("update", path, "--blob", "conv1/0", "-o", out)
    out_raw = out.read_bytes()
    _same_except(in_raw, out_raw, "net", ["conv1/0"])
    after = dict(oracle_blobs(out_raw, "net"))
    _, data_a, diff_a = proto_arrays(before["conv1/0"])
    _, data_b, diff_b = proto_arrays(after["conv1/0"])
    np.testing.assert_array_equal(data_b, (data_a - diff_a).astype(np.float32))
    np.testing.assert_array_equal(diff_b, diff_a)
    # The input file is untouched (it was memory-mapped copy-on-write).
    assert path.read_bytes() == in_raw


def test_scale_in_place_and_update_without_diff(tmp_path):
    state = write_solverstate(tmp_path / "s.solverstate", [values((2, 3)), values((4,))], unknown=True)
    raw = state.read_bytes()
    ok("scale", state, "3", "--blob", "history/0", "-o", state)  # -o may name the input
    _same_except(raw, state.read_bytes(), "solverstate", ["history/0"])
    (_, h0_before), (_, h1_before) = oracle_blobs(raw, "solverstate")
    (_, h0_after), (_, h1_after) = oracle_blobs(state.read_bytes(), "solverstate")
    np.testing.assert_array_equal(proto_arrays(h0_after)[1], proto_arrays(h0_before)[1] * np.float32(3))
    assert h1_after == h1_before
    # History blobs carry no diff: update refuses, naming the blob, and writes nothing.
    assert_error(invoke("update", state, "-o", tmp_path / "u.solverstate"), 3, "history/0", "no diff")
    assert not (tmp_path / "u.solverstate").exists()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(FORMATS), picks=st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True),
       factor=st.sampled_from([0.0, -1.5, 2.0, 1e-3]), unknown=st.booleans())
def test_scaling_any_selection_keeps_the_rest(fmt, picks, factor, unknown):
    raw = net_bytes(fmt, lenet_layers(), unknown=unknown)
    names = [LENET_NAMES[i] for i in sorted(picks)]
    with tempfile.TemporaryDirectory() as tmp:
        path, out = Path(tmp) / "in.caffemodel", Path(tmp) / "out.caffemodel"
        path.write_bytes(raw)
        args = [a for n in names for a in ("--blob", n)]
        ok("scale", path, str(factor), *args, "-o", out)
        out_raw = out.read_bytes()
    _same_except(raw, out_raw, "net", names)
    before, after = dict(oracle_blobs(raw, "net")), dict(oracle_blobs(out_raw, "net"))
    for name in LENET_NAMES:
        if name in names:
            np.testing.assert_array_equal(proto_arrays(after[name])[1],
                                          proto_arrays(before[name])[1] * np.float32(factor))
        else:
            assert after[name].SerializeToString() == before[name].SerializeToString()


# -- extracting blobs ---------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_convert_to_npz(tmp_path, fmt):
    layers = lenet_layers()
    layers[1].diffs = [values((4, 1, 3, 3)), values((4,))]  # conv1 carries a diff
    path, _ = net_file(tmp_path / "net.caffemodel", fmt, layers)
    out = tmp_path / "net.npz"
    ok("convert", path, "-o", out)
    with np.load(out) as z:
        assert sorted(z.files) == sorted(LENET_NAMES + ["conv1/0/diff", "conv1/1/diff"])
        arrays = [b for l in layers for b in l.blobs]
        for name, arr in zip(LENET_NAMES, arrays):
            np.testing.assert_array_equal(z[name], arr)
            assert z[name].dtype == np.float32
        np.testing.assert_array_equal(z["conv1/0/diff"], layers[1].diffs[0])
    # npz is itself a kind: the names and diffs come back.
    doc = open_document(out)
    assert doc.kind == "npz" and sorted(doc.names()) == sorted(LENET_NAMES)
    assert {e.name: e.has_diff for e in doc.entries}["conv1/1"] is True
    # Selection, precision and --no-diff apply.
    ok("convert", path, "--blob", "ip*", "--double", "--no-diff", "-o", out)
    with np.load(out) as z:
        assert sorted(z.files) == ["ip1/0", "ip1/1", "ip2/0", "ip2/1"]
        assert z["ip2/0"].dtype == np.float64
        np.testing.assert_array_equal(z["ip2/0"], layers[5].blobs[0].astype(np.float64))


def test_extract_one_blob_as_npy_and_as_blobproto(tmp_path):
    layers = lenet_layers(diff=True)
    path, _ = net_file(tmp_path / "net.caffemodel", "v1", layers)
    ok("convert", path, "--blob", "ip1/0", "-o", tmp_path / "ip1.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "ip1.npy"), layers[3].blobs[0])
    ok("convert", path, "--blob", "conv1/1", "-o", tmp_path / "conv1_bias.pb")
    proto = pb.BlobProto()
    proto.ParseFromString((tmp_path / "conv1_bias.pb").read_bytes())
    shape, data, diff = proto_arrays(proto)
    assert shape == (4,)
    np.testing.assert_array_equal(data, layers[1].blobs[1])
    np.testing.assert_array_equal(diff, layers[1].diffs[1])
    assert open_document(tmp_path / "conv1_bias.pb").kind == "blob"
    # --format blob says the same whatever the name.
    ok("convert", path, "--blob", "ip2/1", "--format", "blob", "--double", "-o", tmp_path / "bias.caffemodel")
    proto.ParseFromString((tmp_path / "bias.caffemodel").read_bytes())
    np.testing.assert_array_equal(np.array(proto.double_data), layers[5].blobs[1].astype(np.float64))
    # A blob file holds one blob: several selected is a usage error.
    assert_error(invoke("convert", path, "--blob", "conv1", "-o", tmp_path / "two.pb"), 2, "2 selected")
    assert not (tmp_path / "two.pb").exists()


# =====================================================================================
# The library
# =====================================================================================

def test_load_all_every_kind(tmp_path):
    arrays = [values((2, 3)), values((4,))]
    (tmp_path / "b.pb").write_bytes(blob_bytes(arrays[0]))
    write_npy(tmp_path / "a.npy", arrays[0])
    write_npz(tmp_path / "z.npz", {"first": arrays[0], "second": arrays[1]})
    cases = {
        tmp_path / "b.pb": {"0": arrays[0]},
        tmp_path / "a.npy": {"0": arrays[0]},
        tmp_path / "z.npz": {"first": arrays[0], "second": arrays[1]},
        write_vector(tmp_path / "v.pb", arrays): {"0": arrays[0], "1": arrays[1]},
        write_solverstate(tmp_path / "s.solverstate", arrays): {"history/0": arrays[0], "history/1": arrays[1]},
    }
    for fmt in FORMATS:
        path, layers = net_file(tmp_path / f"{fmt}.caffemodel", fmt, unknown=True)
        cases[path] = dict(zip(LENET_NAMES, [b for l in layers for b in l.blobs]))
    for path, expected in cases.items():
        blobs = blobtool.load_all(path)
        assert list(blobs) == list(expected), path.name
        for name, arr in expected.items():
            assert isinstance(blobs[name], blobtool.Blob)
            assert blobs[name].shape == arr.shape
            np.testing.assert_array_equal(blobs[name].cpu_data().reshape(arr.shape), arr)
    # Also from a binary file object.
    with open(tmp_path / "new.caffemodel", "rb") as f:
        assert list(blobtool.load_all(f)) == LENET_NAMES


def test_load_refuses_containers_naming_load_all(tmp_path):
    arrays = [values((2, 3)), values((4,))]
    write_npz(tmp_path / "z.npz", {"a": arrays[0]})
    paths = [write_vector(tmp_path / "v.pb", arrays), write_solverstate(tmp_path / "s.solverstate", arrays),
             tmp_path / "z.npz"] + [net_file(tmp_path / f"{fmt}.caffemodel", fmt)[0] for fmt in FORMATS]
    for path in paths:
        with pytest.raises(BlobToolError, match="load_all") as info:
            blobtool.load(path)
        assert str(path) in str(info.value)
    (tmp_path / "b.pb").write_bytes(blob_bytes(arrays[0]))
    np.testing.assert_array_equal(blobtool.load(tmp_path / "b.pb").cpu_data().reshape(2, 3), arrays[0])


# =====================================================================================
# Caffe's forks
# =====================================================================================

FORK_DTYPES = ["float16", "float32", "float64", "int32", "uint32"]


def _fork_values(dtype: str, shape=(3, 4)) -> np.ndarray:
    if dtype in ("int32", "uint32"):
        base = RNG.integers(0 if dtype == "uint32" else -(2 ** 31), 2 ** 31 - 1, size=shape, dtype=np.int64)
        return base.astype(dtype)
    return values(shape, np.dtype(dtype))


@pytest.mark.parametrize("dtype", FORK_DTYPES)
def test_nvcaffe_raw_data_every_type(tmp_path, dtype):
    data = _fork_values(dtype)
    diff = _fork_values(dtype)
    path = tmp_path / "raw.pb"
    path.write_bytes(raw_blob_bytes(data, diff))
    # Standard protobuf sees no data at all: Caffe's "432 vs. 0".
    std = pb.BlobProto()
    std.ParseFromString(path.read_bytes())
    assert len(std.data) == 0 and len(std.double_data) == 0
    record = one_json(ok("info", "--json", path))
    (row,) = record["blobs"]
    assert row["dtype"] == dtype and row["has_diff"] is True
    assert row["shape"] == [3, 4] and row["bytes"] == 12 * np.dtype(dtype).itemsize
    blob = blobtool.load(path)
    assert blob.dtype == (np.float32 if dtype in ("float16", "float32") else np.float64)
    np.testing.assert_array_equal(blob.cpu_data().reshape(3, 4), data.astype(blob.dtype))
    np.testing.assert_array_equal(blob.cpu_diff().reshape(3, 4), diff.astype(blob.dtype))
    norm = one_json(ok("norm", "--json", path))
    asum, sumsq = _norms(data)
    assert norm["blobs"][0]["data"]["asum"] == pytest.approx(asum, rel=1e-12)
    assert norm["blobs"][0]["data"]["sumsq"] == pytest.approx(sumsq, rel=1e-12)
    assert norm["blobs"][0]["diff"]["sumsq"] == pytest.approx(_norms(diff)[1], rel=1e-12)


def test_raw_float16_norms_accumulate_in_float64(tmp_path):
    # 200,000 float16 values: a float16 or float32 running sum of squares would
    # be visibly off (and 300^2 overflows float16); float64 matches to 1e-12.
    data = (RNG.standard_normal(200_000) * 100 + 7).astype(np.float16)
    data[:3] = [300.0, -65504.0, 6.1e-5]
    path = tmp_path / "big16.pb"
    path.write_bytes(raw_blob_bytes(data))
    norm = one_json(ok("norm", "--json", path))
    exact = data.astype(np.float64)
    assert norm["blobs"][0]["data"]["asum"] == pytest.approx(float(np.abs(exact).sum()), rel=1e-12)
    assert norm["blobs"][0]["data"]["sumsq"] == pytest.approx(float((exact * exact).sum()), rel=1e-12)
    assert math.isfinite(norm["blobs"][0]["data"]["sumsq"])
    # The tolerance above tells a running float32 sum apart (it is off by about 1e-4 here).
    x32 = exact.astype(np.float32)
    f32 = float(np.cumsum(x32 * x32, dtype=np.float32)[-1])
    assert abs(f32 - norm["blobs"][0]["data"]["sumsq"]) > 1e-6 * norm["blobs"][0]["data"]["sumsq"]


def _nvcaffe_net(tmp_path: Path, dtype="float16") -> tuple[Path, dict]:
    """A caffemodel as NVIDIA Caffe writes it: every blob in raw_data, some with raw_diff."""
    arrays = {}
    raw = pb.NetParameter(name="nv").SerializeToString() + NET_UNKNOWN
    for lname, shapes in (("conv1", ((4, 1, 3, 3), (4,))), ("relu", ()), ("fc", ((2, 6), (2,)))):
        head = pb.LayerParameter(name=lname, type="InnerProduct").SerializeToString() + LAYER_UNKNOWN_HEAD
        for i, shape in enumerate(shapes):
            data = _fork_values(dtype, shape)
            diff = _fork_values(dtype, shape) if i == 0 else None
            arrays[f"{lname}/{i}"] = (data, diff)
            head += len_field(7, raw_blob_bytes(data, diff))
        raw += len_field(100, head + LAYER_UNKNOWN_TAIL)
    path = tmp_path / "nvcaffe.caffemodel"
    path.write_bytes(raw)
    return path, arrays


@pytest.mark.parametrize("precision", ["--float", "--double"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_convert_nvcaffe_model_to_standard_caffe(tmp_path, precision, dtype):
    path, arrays = _nvcaffe_net(tmp_path, dtype)
    record = one_json(ok("info", "--json", path))
    assert {b["name"]: b["dtype"] for b in record["blobs"]} == {n: dtype for n in arrays}
    out = tmp_path / "standard.caffemodel"
    ok("convert", precision, path, "-o", out)
    out_raw = out.read_bytes()
    target = np.float32 if precision == "--float" else np.float64
    for name, proto in oracle_blobs(out_raw, "net"):
        data, diff = arrays[name]
        # Only standard fields: no raw_data/raw_data_type left for Caffe to trip on.
        numbers = {n for n, _ in fields_of(proto.SerializeToString())}
        assert numbers <= ({5, 6, 7} if precision == "--float" else {7, 8, 9}), (name, numbers)
        shape, got, got_diff = proto_arrays(proto)
        assert shape == data.shape and got.dtype == target
        np.testing.assert_array_equal(got, data.astype(target))
        if diff is None:
            assert got_diff is None
        else:
            np.testing.assert_array_equal(got_diff, diff.astype(target))
    # Everything but the blobs is as it was.
    _same_except(path.read_bytes(), out_raw, "net", list(arrays))
    # And blobtool reads the result with the same values (where the conversion is exact).
    result = invoke("compare", "--json", path, out)
    exact = not (dtype == "float64" and precision == "--float")
    assert one_json(result)["equal"] is exact and result.exit_code == (0 if exact else 1)


def test_convert_half_writes_nvcaffe_float16_and_round_trips(tmp_path):
    data = values((3, 5))
    diff = values((3, 5))
    std = tmp_path / "std.pb"
    std.write_bytes(blob_bytes(data, diff=diff))
    half = tmp_path / "half.pb"
    ok("convert", "--half", std, "-o", half)
    raw = half.read_bytes()
    fields = list(wire.iter_fields(raw, 0, len(raw)))
    assert [(f.number, f.wire_type) for f in fields] == [(7, wire.LEN), (10, wire.VARINT), (11, wire.VARINT),
                                                          (12, wire.LEN), (13, wire.LEN)]
    by_number = {f.number: f for f in fields}
    assert by_number[10].value == 2 and by_number[11].value == 2  # FLOAT16
    np.testing.assert_array_equal(np.frombuffer(raw[by_number[12].start:by_number[12].end], "<f2").reshape(3, 5),
                                  data.astype(np.float16))
    np.testing.assert_array_equal(np.frombuffer(raw[by_number[13].start:by_number[13].end], "<f2").reshape(3, 5),
                                  diff.astype(np.float16))
    assert len(raw) < len(std.read_bytes()) * 0.6
    assert one_json(ok("info", "--json", half))["blobs"][0]["dtype"] == "float16"
    # Back to float: the float16 values exactly, in standard fields.
    back = tmp_path / "back.pb"
    ok("convert", "--float", half, "-o", back)
    proto = pb.BlobProto()
    proto.ParseFromString(back.read_bytes())
    np.testing.assert_array_equal(np.array(proto.data, np.float32).reshape(3, 5),
                                  data.astype(np.float16).astype(np.float32))
    # Half to half: the same bytes.
    ok("convert", half, "-o", tmp_path / "again.pb")
    assert (tmp_path / "again.pb").read_bytes() == raw
    ok("convert", "--half", half, "-o", tmp_path / "again.pb")
    assert (tmp_path / "again.pb").read_bytes() == raw


def test_convert_half_inside_a_container_keeps_the_rest(tmp_path):
    path, layers = net_file(tmp_path / "net.caffemodel", "new", lenet_layers(), unknown=True)
    out = tmp_path / "half.caffemodel"
    ok("convert", "--half", "--blob", "ip1", path, "-o", out)
    in_raw, out_raw = path.read_bytes(), out.read_bytes()
    _same_except(in_raw, out_raw, "net", ["ip1/0", "ip1/1"])
    doc = open_document(out)
    assert {e.name: e.dtype.name for e in doc.entries} == {n: ("float16" if n.startswith("ip1") else "float32")
                                                           for n in LENET_NAMES}
    np.testing.assert_array_equal(doc.entries[2].blob().cpu_data().reshape(5, 16),
                                  layers[3].blobs[0].astype(np.float16).astype(np.float32))
    # And back to float for Caffe: the standard model again (float16-rounded values in ip1).
    ok("convert", "--float", out, "-o", tmp_path / "float.caffemodel")
    _same_except(in_raw, (tmp_path / "float.caffemodel").read_bytes(), "net", ["ip1/0", "ip1/1"])
    assert invoke("compare", path, tmp_path / "float.caffemodel", "--blob", "conv1", "--blob", "ip2").exit_code == 0


def test_ditcaffe_half_data_dispatches_on_wire_type(tmp_path):
    data = values((2, 7), np.float16)
    data.flat[:4] = [0.0, -0.0, 65504.0, 6e-8]  # 0, the sign bit (3-byte varint), max, subnormal
    path = tmp_path / "dit.pb"
    path.write_bytes(half_blob_bytes(data))
    # Field 10 is packed (wire type 2) here, a varint (raw_data_type) in NVIDIA's form.
    assert (10, wire.LEN) in fields_of(path.read_bytes())
    record = one_json(ok("info", "--json", path))
    assert record["blobs"][0]["dtype"] == "float16" and record["blobs"][0]["shape"] == [2, 7]
    blob = blobtool.load(path)
    got = blob.cpu_data().reshape(2, 7)
    np.testing.assert_array_equal(got, data.astype(np.float32))
    assert np.signbit(got.flat[1])
    norm = one_json(ok("norm", "--json", path))
    assert norm["blobs"][0]["data"]["sumsq"] == pytest.approx(_norms(data)[1], rel=1e-12)
    # In a vector beside an NVIDIA raw FLOAT16 blob: each by its wire type.
    nv = values((2, 7), np.float16)
    vec = len_field(1, half_blob_bytes(data)) + len_field(1, raw_blob_bytes(nv))
    (tmp_path / "mixed.vec").write_bytes(vec)
    blobs = blobtool.load_all(tmp_path / "mixed.vec")
    np.testing.assert_array_equal(blobs["0"].cpu_data().reshape(2, 7), data.astype(np.float32))
    np.testing.assert_array_equal(blobs["1"].cpu_data().reshape(2, 7), nv.astype(np.float32))
    # convert --float makes it standard.
    ok("convert", "--float", path, "-o", tmp_path / "std.pb")
    proto = pb.BlobProto()
    proto.ParseFromString((tmp_path / "std.pb").read_bytes())
    np.testing.assert_array_equal(np.array(proto.data, np.float32).reshape(2, 7), data.astype(np.float32))
    assert {n for n, _ in fields_of((tmp_path / "std.pb").read_bytes())} == {5, 7}


TERNARY_KEPT = [{"field": 10, "why": "packed varints end mid-value"},
                {"field": 11, "why": "holds 7 values as half_diff, the shape 8"}]


def test_a_fork_reusing_field_10_is_read_as_bvlc_caffe_reads_it(tmp_path):
    data = values((2, 4))
    raw = ternary_blob_bytes(data)
    fork = ternary_fork_fields()
    # The oracle: BVLC Caffe's schema reads the values from `data`, the fork's fields unknown to it.
    proto = pb.BlobProto()
    proto.ParseFromString(raw)
    np.testing.assert_array_equal(np.array(proto.data, np.float32).reshape(2, 4), data)
    path = tmp_path / "ternary.pb"
    path.write_bytes(raw)
    record = one_json(ok("info", "--json", path))
    blob = record["blobs"][0]
    assert (blob["shape"], blob["dtype"], blob["has_diff"]) == ([2, 4], "float32", False)
    assert blob["kept_fork_fields"] == TERNARY_KEPT
    text = ok("info", path).stdout
    assert "  note: fork fields (10, 11) in 1 blob read as unknown fields, as BVLC Caffe reads them; kept as " \
           "they were" in text
    norm = one_json(ok("norm", "--json", path))["blobs"][0]["data"]
    assert (norm["asum"], norm["sumsq"]) == pytest.approx(_norms(data), rel=1e-12)
    # A rewrite keeps the fork's fields byte for byte, after Caffe's own.
    ok("convert", path, "-o", tmp_path / "same.pb")
    assert (tmp_path / "same.pb").read_bytes() == raw
    ok("convert", "--double", path, "-o", tmp_path / "double.pb")
    out = (tmp_path / "double.pb").read_bytes()
    assert out.endswith(fork)
    proto.ParseFromString(out)
    np.testing.assert_array_equal(np.array(proto.double_data).reshape(2, 4), data.astype(np.float64))
    ok("convert", path, "-o", tmp_path / "ternary.npz")
    np.testing.assert_array_equal(np.load(tmp_path / "ternary.npz")["0"], data)
    # In a net (fixed32 fields 12 and 13 inside a layer's blobs), a vector and a solver state.
    weights, bias = values((2, 4)), values((8,))
    plain = values((3,))
    net = write_net(tmp_path / "ternary.caffemodel", "new", [
        Layer("conv1", "Convolution", [ternary_blob_bytes(weights), ternary_blob_bytes(bias)]),
        Layer("ip", "InnerProduct", [plain])])
    record = one_json(ok("info", "--json", net))
    assert record["kind"] == "net"
    assert [b.get("kept_fork_fields") for b in record["blobs"]] == [TERNARY_KEPT, TERNARY_KEPT, None]
    assert "in 2 blobs read as unknown fields" in ok("info", net).stdout
    ok("convert", net, "-o", tmp_path / "same.caffemodel")
    assert (tmp_path / "same.caffemodel").read_bytes() == net.read_bytes()
    ok("scale", "--blob", "conv1/0", net, "2", "-o", tmp_path / "scaled.caffemodel")
    scaled = pb.NetParameter()
    scaled.ParseFromString((tmp_path / "scaled.caffemodel").read_bytes())
    np.testing.assert_array_equal(np.array(scaled.layer[0].blobs[0].data, np.float32).reshape(2, 4), weights * 2)
    assert scaled.layer[0].blobs[0].SerializeToString().endswith(fork)
    assert scaled.layer[0].blobs[1].SerializeToString() == ternary_blob_bytes(bias)
    for kind, container in (("vector", len_field(1, raw) + len_field(1, blob_bytes(plain))),
                            ("solverstate", varint_field(1, 100) + len_field(3, raw))):
        (tmp_path / kind).write_bytes(container)
        record = one_json(ok("info", "--json", tmp_path / kind))
        assert record["kind"] == kind and record["blobs"][0]["kept_fork_fields"] == TERNARY_KEPT
    # The same for NVIDIA's numbers: a raw type no Caffe has and a raw_data that fits no type.
    nv_fork = varint_field(10, 7) + len_field(12, b"abcdef")
    (tmp_path / "nv.pb").write_bytes(blob_bytes(data) + nv_fork)
    blob = one_json(ok("info", "--json", tmp_path / "nv.pb"))["blobs"][0]
    assert [k["field"] for k in blob["kept_fork_fields"]] == [10, 12]
    ok("convert", "--double", tmp_path / "nv.pb", "-o", tmp_path / "nv2.pb")
    assert (tmp_path / "nv2.pb").read_bytes().endswith(nv_fork)
    # Without Caffe's own payload, field 10 is the values: one that does not decode is an error.
    (tmp_path / "bare.pb").write_bytes(blob_bytes(shape=(6,)) + fork[:fork.index(bytes([11 << 3 | 2]))])
    assert_error(invoke("info", "--stats", tmp_path / "bare.pb"), 3,
                 "bare.pb: at byte 5: field 10 (raw_data_type/half_data): packed varints end mid-value")


def test_diff_without_data_is_reported_not_silent(tmp_path):
    # As a fork that renumbered BlobProto's fields might leave it: the values
    # sit in field 6 (diff) and there is no data of any kind.
    diff = values((2, 3))
    raw = blob_bytes(shape=(2, 3)) + len_field(6, diff.astype("<f4").tobytes())
    path = tmp_path / "c3d.pb"
    path.write_bytes(raw)
    result = ok("info", path)
    assert "has a diff but no data" in result.stderr and str(path) in result.stderr
    assert "has a diff but no data" not in result.stdout
    result = ok("info", "--json", path)
    assert "has a diff but no data" in result.stderr
    assert one_json(result)["blobs"][0]["has_diff"] is True
    assert_error(invoke("norm", path), 3, "has a diff but no data")
    assert_error(invoke("convert", path, "-o", tmp_path / "o.pb"), 3, "has a diff but no data")
    with pytest.raises(FormatError, match="has a diff but no data"):
        blobtool.load(path)
    # Inside a net: the warning names the blob; the other blobs still read.
    number, body = layer_bytes("new", Layer("odd", "InnerProduct", []), unknown=False)
    net = net_bytes("new", lenet_layers()) + len_field(number, body + len_field(7, raw))
    (tmp_path / "net.caffemodel").write_bytes(net)
    result = ok("info", tmp_path / "net.caffemodel")
    assert "odd/0" in result.stderr and "has a diff but no data" in result.stderr
    assert_error(invoke("norm", tmp_path / "net.caffemodel"), 3, "has a diff but no data")
    ok("norm", tmp_path / "net.caffemodel", "--blob", "conv1")
    with pytest.raises(FormatError, match="has a diff but no data"):
        blobtool.load_all(tmp_path / "net.caffemodel")
    # A blob with data and diff gets no warning.
    (tmp_path / "fine.pb").write_bytes(blob_bytes(diff, diff=diff))
    assert ok("info", tmp_path / "fine.pb").stderr == ""


# =====================================================================================
# Files Caffe wrote
# =====================================================================================

LENET_SHAPES = {"conv1/0": (20, 1, 5, 5), "conv1/1": (20,), "conv2/0": (50, 20, 5, 5), "conv2/1": (50,),
                "ip1/0": (500, 800), "ip1/1": (500,), "ip2/0": (10, 500), "ip2/1": (10,)}


def test_real_caffemodel(realworld, tmp_path):
    path = realworld / "lenet_iter_10000.caffemodel"
    raw = path.read_bytes()
    record = one_json(ok("info", "--json", path))
    assert record["kind"] == "net" and record["name"] == "LeNet"
    assert {b["name"]: tuple(b["shape"]) for b in record["blobs"]} == LENET_SHAPES
    assert [b["name"] for b in record["blobs"]] == list(LENET_SHAPES)
    assert [b["type"] for b in record["blobs"]] == ["Convolution"] * 4 + ["InnerProduct"] * 4
    blobs = blobtool.load_all(path)
    assert list(blobs) == list(LENET_SHAPES)
    for name, proto in oracle_blobs(raw, "net"):
        shape, data, _ = proto_arrays(proto)
        assert blobs[name].shape == shape == LENET_SHAPES[name]
        np.testing.assert_array_equal(blobs[name].cpu_data().reshape(shape), data)
    norm = one_json(ok("norm", "--json", path, "--blob", "ip1/0"))
    _, ip1, _ = proto_arrays(dict(oracle_blobs(raw, "net"))["ip1/0"])
    assert norm["blobs"][0]["data"]["sumsq"] == pytest.approx(_norms(ip1)[1], rel=1e-12)
    # Convert with no changes: the same bytes.
    ok("convert", path, "-o", tmp_path / "copy.caffemodel")
    assert (tmp_path / "copy.caffemodel").read_bytes() == raw
    # conv2 in double: only conv2's blobs differ, every other byte of the model is kept.
    ok("convert", path, "--blob", "conv2", "--double", "-o", tmp_path / "conv2d.caffemodel")
    out_raw = (tmp_path / "conv2d.caffemodel").read_bytes()
    _same_except(raw, out_raw, "net", ["conv2/0", "conv2/1"])
    after = dict(oracle_blobs(out_raw, "net"))
    _, conv2, _ = proto_arrays(after["conv2/0"])
    assert conv2.dtype == np.float64
    np.testing.assert_array_equal(conv2, blobs["conv2/0"].cpu_data().reshape(50, 20, 5, 5).astype(np.float64))
    assert invoke("compare", path, tmp_path / "conv2d.caffemodel").exit_code == 0


def test_real_solverstate(realworld, tmp_path):
    path = realworld / "lenet_iter_10000.solverstate"
    raw = path.read_bytes()
    record = one_json(ok("info", "--json", path))
    assert record["kind"] == "solverstate" and record["iter"] == 10000
    assert [b["name"] for b in record["blobs"]] == [f"history/{i}" for i in range(8)]
    assert [tuple(b["shape"]) for b in record["blobs"]] == list(LENET_SHAPES.values())
    blobs = blobtool.load_all(path)
    for name, proto in oracle_blobs(raw, "solverstate"):
        shape, data, _ = proto_arrays(proto)
        np.testing.assert_array_equal(blobs[name].cpu_data().reshape(shape), data)
    ok("convert", path, "-o", tmp_path / "copy.solverstate")
    assert (tmp_path / "copy.solverstate").read_bytes() == raw
    ok("scale", path, "0", "--blob", "history/7", "-o", tmp_path / "zeroed.solverstate")
    out_raw = (tmp_path / "zeroed.solverstate").read_bytes()
    _same_except(raw, out_raw, "solverstate", ["history/7"])
    state = message_of(out_raw, "solverstate")
    assert state.iter == 10000 and not np.any(np.array(state.history[7].data))
    assert len(state.history[7].data) == 10
