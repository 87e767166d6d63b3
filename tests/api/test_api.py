"""The library's write API: everything the command line writes, from Python, with the formats' own oracles."""

from __future__ import annotations

import io

import numpy as np
import pytest

import blobtool
from blobtool import Blob, BlobToolError, ExitCode, load, load_all, open_document, save, select, transplant, write
from blobtool._pb import blobtool_caffe_pb2 as pb


def _net_file(path):
    net = pb.NetParameter(name="tiny")
    rng = np.random.default_rng(3)
    for name, shapes in (("conv1", [(4, 1, 3, 3), (4,)]), ("relu1", []), ("fc", [(2, 36), (2,)])):
        layer = net.layer.add(name=name, type="Convolution" if name == "conv1" else "Other")
        for shape in shapes:
            blob = layer.blobs.add()
            blob.shape.dim.extend(shape)
            blob.data.extend(rng.standard_normal(int(np.prod(shape))).astype(np.float32).tolist())
            blob.diff.extend(rng.standard_normal(int(np.prod(shape))).astype(np.float32).tolist())
    path.write_bytes(net.SerializeToString())
    return path, net


def test_exit_codes_are_one_enum():
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 5, 70, 129, 130, 143]
    assert blobtool.errors.FormatError.exit_code is ExitCode.INPUT
    assert blobtool.errors.OutputError.exit_code == 5


def test_every_exit_code_is_in_the_help_and_the_docs():
    from pathlib import Path

    from blobtool.cli import cli

    root = Path(__file__).resolve().parents[2]
    help_text = " ".join(cli.help.split())
    table = (root / "docs" / "safety.md").read_text()
    readme = " ".join((root / "README.md").read_text().split())
    for code in ExitCode:
        if code >= 128:
            assert f"{int(code)} SIG" in table and str(int(code)) in help_text, code
            continue
        assert f" {int(code)} " in help_text and f"\n| {int(code)} |" in table, code
        assert f" {int(code)} " in readme.split("Exit codes:")[1].split("Errors are")[0], code
    assert "| 128 + N |" in table and "128 + N" in readme


def test_write_npz_from_a_document_keys_blobs_and_diffs(tmp_path):
    path, net = _net_file(tmp_path / "net.caffemodel")
    doc = open_document(path)
    kind = write(doc, None, tmp_path / "all.npz")
    assert kind == "npz"
    with np.load(tmp_path / "all.npz") as arrays:  # numpy is the oracle
        assert sorted(arrays.files) == sorted(["conv1/0", "conv1/0/diff", "conv1/1", "conv1/1/diff",
                                               "fc/0", "fc/0/diff", "fc/1", "fc/1/diff"])
        assert np.array_equal(arrays["fc/0"], np.asarray(net.layer[2].blobs[0].data, np.float32).reshape(2, 36))
        assert np.array_equal(arrays["conv1/1/diff"], np.asarray(net.layer[0].blobs[1].diff, np.float32))


def test_write_selection_same_kind_keeps_every_other_byte(tmp_path):
    path, net = _net_file(tmp_path / "net.caffemodel")
    doc = open_document(path)
    entries = select(doc, ["fc"])
    blobs = {e.name: e.blob() for e in entries}
    assert write(doc, blobs, tmp_path / "same.caffemodel", precision="double") == "net"
    back = pb.NetParameter.FromString((tmp_path / "same.caffemodel").read_bytes())  # protobuf is the oracle
    assert back.layer[0] == net.layer[0] and back.name == "tiny"
    assert list(back.layer[2].blobs[0].double_data) == pytest.approx(list(net.layer[2].blobs[0].data))
    assert len(back.layer[2].blobs[0].data) == 0


def test_write_blobs_made_in_python_as_npy_blob_and_npz(tmp_path):
    blob = Blob(2, 3, dtype=np.float64)
    blob.mutable_cpu_data()[:] = np.arange(6.0)
    assert write(None, {"w": blob}, tmp_path / "w.npy") == "npy"
    assert np.array_equal(np.load(tmp_path / "w.npy"), np.arange(6.0).reshape(2, 3))
    assert write(None, {"w": blob}, tmp_path / "w.pb", precision="float") == "blob"
    proto = pb.BlobProto.FromString((tmp_path / "w.pb").read_bytes())
    assert list(proto.shape.dim) == [2, 3] and list(proto.data) == list(range(6))
    out = io.BytesIO()
    write(None, {"w": blob}, out, format="npz", precision="half")
    out.seek(0)
    with np.load(out) as arrays:
        assert arrays["w"].dtype == np.float16 and arrays.files == ["w"]


@pytest.mark.parametrize("kwargs, message", [
    ({"format": "same"}, "no container form to write back"),
    ({"format": "tiff"}, "unknown output format 'tiff'"),
    ({"layout": "legacy", "format": "blob"}, "the legacy layout holds at most 4 axes"),
])
def test_write_refuses_what_it_cannot_write(tmp_path, kwargs, message):
    blob = Blob(1, 1, 1, 1, 2)
    with pytest.raises(BlobToolError, match=message) as info:
        write(None, {"x": blob}, tmp_path / "x.out", **kwargs)
    assert info.value.exit_code == ExitCode.USAGE
    assert not (tmp_path / "x.out").exists()


def test_load_save_load_all_round_trip(tmp_path):
    blob = Blob(3, 2)
    blob.mutable_cpu_data()[:] = [1, 2, 3, 4, 5, 6]
    save(blob, tmp_path / "b.pb", layout="legacy")
    again = load(tmp_path / "b.pb")
    assert again.shape == (1, 1, 3, 2) and again.origin.layout == "legacy"
    assert list(load_all(tmp_path / "b.pb")) == ["0"]


def test_write_back_a_container_only_with_its_own_blobs(tmp_path):
    path, _ = _net_file(tmp_path / "net.caffemodel")
    doc = open_document(path)
    with pytest.raises(BlobToolError, match="blob 'extra' is not in .*only its own blobs") as info:
        write(doc, {"extra": Blob(2)}, tmp_path / "out.caffemodel")
    assert info.value.exit_code == ExitCode.USAGE
    assert not (tmp_path / "out.caffemodel").exists()


def _ones_file(tmp_path, n):
    from builders import blob_bytes
    from blobtool.formats.caffe import wire

    path = tmp_path / "ones.pb"
    path.write_bytes(blob_bytes(shape=[n]) + wire.len_field_header(5, 4 * n) + np.ones(n, np.float32).tobytes())
    return path


def test_values_changed_in_memory_are_the_ones_summed_and_kept_inside_releasing(tmp_path):
    # Inside releasing() the sums of a mapped blob read the file's bytes, and summed pages are dropped:
    # only for bytes nobody was handed for writing. A scaled or written blob keeps its own values.
    n = 1 << 20  # 4 MiB: read from the file in 1 MiB pieces when it is still the file's
    blob = load(str(_ones_file(tmp_path, n)))
    with blobtool.files.releasing():
        assert blob.asum_data() == n  # the file's bytes
        blob.scale_data(3)
        assert blob.asum_data() == 3 * n
        assert blob.sumsq_data() == 9 * n
    other = load(str(_ones_file(tmp_path, n)))
    with blobtool.files.releasing():
        other.mutable_cpu_data()[:5] = 100
        assert other.asum_data() == n + 5 * 99
        assert other.asum_data() == n + 5 * 99  # the written page was not dropped
    assert other.cpu_data()[:6].tolist() == [100] * 5 + [1]


def test_a_document_is_a_context_manager_with_a_one_line_repr(tmp_path):
    path = _ones_file(tmp_path, 1000)
    with open_document(str(path)) as doc:
        assert repr(doc) == f"<Document {str(path)!r}: blob (caffe), 1 blob, {path.stat().st_size} bytes>"
        blob = doc.entries[0].blob()
    assert doc.closed and doc.entries == [] and repr(doc) == f"<Document {str(path)!r}: closed>"
    assert blob.asum_data() == 1000  # a blob built before the close keeps its values
    doc.close()  # twice: nothing
    with pytest.raises(BlobToolError, match="closed"):
        doc.size


@pytest.mark.parametrize("name, content, offset, start", [
    ("a.npy", None, 128, "truncated at byte 128: .npy array data needs 40 bytes, 36 remain"),
    ("b.npy", b"\x93NUMPY\x01\x00\xff", 8, "invalid .npy header: truncated at byte 8: the header length needs 2 bytes"),
    ("c.safetensors", (8).to_bytes(8, "little") + b'{"a": 1,', 16, "at byte 16: the header is not JSON"),
    ("d.pb", b"\x2a\x10" + b"\0" * 8, 0, "truncated at byte 0: field 5 (data) declares 16 bytes, 8 remain"),
])
def test_a_message_that_names_a_byte_offset_carries_it_in_the_error(tmp_path, name, content, offset, start):
    path = tmp_path / name
    if content is None:
        np.save(path, np.arange(10, dtype="<f4"))
        path.write_bytes(path.read_bytes()[:-4])
    else:
        path.write_bytes(content)
    with pytest.raises(BlobToolError) as caught:
        load(str(path))
    assert caught.value.offset == offset
    assert str(caught.value).startswith(f"{path}: {start}")


def test_a_call_s_work_settings_stay_with_it_and_its_threads(tmp_path, monkeypatch):
    # Threads, progress and page release belong to the with block that sets them: another thread
    # of the same process, running at the same time, keeps the library's defaults.
    import threading

    from blobtool import kernels, work

    monkeypatch.setattr(kernels.threads, "PARALLEL_MIN_BYTES", 0)
    seen, elsewhere = [], []
    x = np.ones(8 * kernels.CHUNK, np.float32)
    inside = threading.Event()
    done = threading.Event()

    def other():
        inside.wait(10)
        elsewhere.append(work.current())
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with work.using(threads=4, progress=seen.append, pages=blobtool.files.PAGES):
        inside.set()
        done.wait(10)
        assert kernels.asum_sumsq(x) == (x.size, x.size)
        assert (work.current().threads, work.current().pages) == (4, blobtool.files.PAGES)
    thread.join()
    assert sum(seen) == x.nbytes  # the kernels' own threads reported to this call's progress
    assert elsewhere == [work.Work()]
    assert work.current() == work.Work()


def test_a_precision_is_read_once_where_a_write_is_asked_for(tmp_path):
    from blobtool.formats.origin import Precision

    assert Precision.of("double").for_blob("any") == "double"
    each = Precision.of({"a": "half", "b": None})
    assert (each.for_blob("a"), each.for_blob("b"), each.for_blob("c")) == ("half", None, None)
    assert Precision.of(each) is each
    with pytest.raises(BlobToolError, match="precision must be"):
        write(None, {"x": Blob(2)}, str(tmp_path / "x.npz"), precision=("data", None))
    assert not (tmp_path / "x.npz").exists()


# -- errors name the library's parameters; the command names its options ----------------------------

def _errors_sites(tmp_path):
    """(library call, its message, the command's arguments, the command's stderr line) per kind of raise site."""
    net, _ = _net_file(tmp_path / "tiny.caffemodel")
    one = tmp_path / "one.npy"
    np.save(one, np.zeros(3, np.float32))
    proto = tmp_path / "tiny.prototxt"
    proto.write_text('name: "tiny"\nlayer { name: "conv1" type: "Convolution" }\n')
    return [
        (lambda: select(open_document(net), ["nope"]),
         f"{net}: patterns='nope' selects nothing; blobs: conv1/0, conv1/1, fc/0, fc/1",
         ["convert", net, "--blob", "nope", "-o", tmp_path / "o.npz"],
         f"blobtool: {net}: --blob 'nope' selects nothing; blobs: conv1/0, conv1/1, fc/0, fc/1"),
        (lambda: write(open_document(net), None, tmp_path / "o.npy"),
         ".npy holds one array; 4 selected (choose one with blobs, or use .npz)",
         ["convert", net, "-o", tmp_path / "o.npy"],
         "blobtool: .npy holds one array; 4 selected (choose one with --blob, or use .npz)"),
        (lambda: transplant(open_document(net), one, tmp_path / "o.caffemodel"),
         f"{one}: into takes a net (.caffemodel, .caffemodel.h5, .prototxt) as the template; this is a npy file",
         ["transplant", net, one, "-o", tmp_path / "o.caffemodel"],
         f"blobtool: {one}: --into takes a net (.caffemodel, .caffemodel.h5, .prototxt) as the template; "
         "this is a npy file"),
        (lambda: transplant(open_document(net), proto, tmp_path / "o.caffemodel", partial=True),
         f"{proto}: partial keeps a template's values, and a .prototxt holds none: every blob needs a value",
         ["transplant", net, proto, "--partial", "-o", tmp_path / "o.caffemodel"],
         f"blobtool: {proto}: --partial keeps a template's values, and a .prototxt holds none: every blob needs "
         "a value"),
    ]


def _check_sites(sites) -> None:
    """Each call raises `message` (the library's words); the command's arguments give the one stderr `line`."""
    from runner import run_blobtool

    for call, message, args, line in sites:
        with pytest.raises(BlobToolError) as caught:
            call()
        assert str(caught.value) == message
        assert "--" not in str(caught.value)
        result = run_blobtool(*args, text=True)
        assert result.stderr.splitlines() == [line], args
        assert result.returncode == caught.value.exit_code


def test_library_errors_name_parameters_and_the_command_its_options(tmp_path):
    _check_sites(_errors_sites(tmp_path))


def _more_sites(tmp_path):
    """Sites of the surgery, the PyTorch side, the writers, info's records and show's pictures."""
    from blobtool.records import info_record
    from blobtool.report.pictures import view
    from blobtool.surgery.rename import edit_layers, parse_renames
    from blobtool.torchport.naming import torch_names
    from builders import write_blob, write_npy, write_npz

    net, _ = _net_file(tmp_path / "tiny.caffemodel")
    blob = write_blob(tmp_path / "b.pb", np.zeros((2, 3), np.float32))
    cube = write_npy(tmp_path / "c.npy", np.zeros((3, 2, 2), np.float32))
    huge = write_npy(tmp_path / "huge.npy", np.full(3, 1e30, np.float32))
    values = write_npz(tmp_path / "v.npz", {"conv1/0": np.zeros((4, 1, 3, 3), np.float32)})
    out = tmp_path / "out"
    out.mkdir()
    layers = "layers: conv1, relu1, fc"
    return [
        (lambda: parse_renames(["ip1"]),
         "pairs='ip1': expected OLD=NEW (a layer's name, '=', its new name)",
         ["edit", net, "--rename", "ip1", "-o", out / "x.caffemodel"],
         "blobtool: --rename 'ip1': expected OLD=NEW (a layer's name, '=', its new name)"),
        (lambda: parse_renames(["conv1=a", "conv1=b"]),
         "pairs: layer 'conv1' is renamed twice ('a' and 'b')",
         ["edit", net, "--rename", "conv1=a", "--rename", "conv1=b", "-o", out / "x.caffemodel"],
         "blobtool: --rename: layer 'conv1' is renamed twice ('a' and 'b')"),
        (lambda: edit_layers(open_document(net), {"conv1": "fc"}, []),
         f"{net}: renames conv1=fc: another layer is called 'fc'",
         ["edit", net, "--rename", "conv1=fc", "-o", out / "x.caffemodel"],
         f"blobtool: {net}: --rename conv1=fc: another layer is called 'fc'"),
        (lambda: edit_layers(open_document(net), {}, ["fc9"]),
         f"{net}: no layer called 'fc9' (renames, drops); {layers}",
         ["edit", net, "--drop", "fc9", "-o", out / "x.caffemodel"],
         f"blobtool: {net}: no layer called 'fc9' (--rename, --drop); {layers}"),
        (lambda: edit_layers(open_document(blob), {}, ["x"]),
         f"{blob}: renames and drops change a net's layers; this is a blob file",
         ["edit", blob, "--drop", "x", "-o", out / "c.pb"],
         f"blobtool: {blob}: --rename and --drop change a net's layers; this is a blob file"),
        (lambda: torch_names(open_document(cube)),
         f"{cube}: names='torch' renames a .caffemodel's blobs by layer type; a npy file has none",
         ["info", cube, "--names", "torch"],
         f"blobtool: {cube}: --names torch renames a .caffemodel's blobs by layer type; a npy file has none"),
        (lambda: write(open_document(net), None, out / "o.pb", format="blob"),
         "format='blob' writes one blob (a BlobProto file): 4 selected; choose one with blobs, keep the input's kind "
         "(net) with format='same', or write .npz",
         ["convert", net, "--format", "blob", "-o", out / "o.pb"],
         "blobtool: --format blob writes one blob (a BlobProto file): 4 selected; choose one with --blob, keep the "
         "input's kind (net) with --format same, or write .npz"),
        (lambda: write(open_document(net), None, out / "o.npz", precision="bf16"),
         "bfloat16 (precision='bf16') is written to .safetensors only: the npz output (format numpy) has no bfloat16 "
         "type; write .safetensors, or use precision='half' (float16)",
         ["convert", net, "--precision", "bf16", "-o", out / "o.npz"],
         "blobtool: bfloat16 (--precision bf16) is written to .safetensors only: the npz output (format numpy) has no "
         "bfloat16 type; write .safetensors, or use --precision half (float16)"),
        (lambda: write(open_document(net), None, out / "o.caffemodel.h5", layout="legacy"),
         "layout='legacy': Caffe's HDF5 snapshots store each blob as an N-D dataset; the legacy "
         "num/channels/height/width layout exists only in the protobuf form",
         ["convert", net, "--layout", "legacy", "-o", out / "o.caffemodel.h5"],
         "blobtool: --layout legacy: Caffe's HDF5 snapshots store each blob as an N-D dataset; the legacy "
         "num/channels/height/width layout exists only in the protobuf form"),
        (lambda: write(open_document(huge), None, out / "o.npy", precision="half", half_strict=True),
         f"{huge}: half_strict: blob 0: 3 of 3 values are past float16's range (largest 1e+30, float16 holds up to "
         "65504); nothing written",
         ["convert", huge, "--precision", "half", "--strict", "-o", out / "o.npy"],
         f"blobtool: {huge}: --strict: blob 0: 3 of 3 values are past float16's range (largest 1e+30, float16 "
         "holds up to 65504); nothing written"),
        (lambda: transplant(open_document(values), net, out / "o.caffemodel"),
         f"{values}: does not fit {net}: missing 3 (conv1/1, fc/0, fc/1); partial keeps the template's values for "
         "the blobs without one",
         ["transplant", values, net, "-o", out / "o.caffemodel"],
         f"blobtool: {values}: does not fit {net}: missing 3 (conv1/1, fc/0, fc/1); --partial keeps the template's "
         "values for the blobs without one"),
        (lambda: info_record(open_document(blob), [], layer_defs=True),
         f"{blob}: layer_defs lists a net's layers and this file is a blob",
         ["info", blob, "--layers"],
         f"blobtool: {blob}: --layers lists a net's layers and this file is a blob"),
        (lambda: view(np.zeros((3, 2, 2), np.float32), index=0),
         "index picks one item of a 4-D blob (N, C, H, W); this blob has shape (3, 2, 2)",
         ["show", cube, "--index", "0"],
         f"blobtool: {cube}: blob 0: --index picks one item of a 4-D blob (N, C, H, W); this blob has shape (3, 2, 2)"),
        (lambda: view(np.zeros((3, 2, 2), np.float32), channel=5),
         "channel=5 is out of range: the blob has 3 channels (0..2)",
         ["show", cube, "--channel", "5"],
         f"blobtool: {cube}: blob 0: --channel 5 is out of range: the blob has 3 channels (0..2)"),
    ]


def test_library_errors_of_surgery_writers_records_and_pictures_name_parameters(tmp_path):
    _check_sites(_more_sites(tmp_path))


def test_write_leaves_a_nets_definition_to_definition_text(tmp_path):
    net, _ = _net_file(tmp_path / "tiny.caffemodel")
    with pytest.raises(BlobToolError) as caught:
        write(open_document(net), None, tmp_path / "o.prototxt")
    assert str(caught.value) == (f"{net}: a .prototxt holds a net's definition and no blobs: "
                                 "blobtool.definition_text(src, dest) writes it")
    assert not (tmp_path / "o.prototxt").exists()
    text = blobtool.definition_text(net, tmp_path / "o.prototxt")
    assert (tmp_path / "o.prototxt").read_text() == text and 'name: "conv1"' in text


def test_a_snapshot_without_types_names_the_net_parameter(tmp_path):
    pytest.importorskip("h5py")
    from builders import h5_net_bytes, write_h5

    snapshot = write_h5(tmp_path / "s.caffemodel.h5", h5_net_bytes([("conv1", [np.zeros((2, 3), np.float32)])]))
    rest = ("renames a .caffemodel's blobs by layer type, and Caffe's HDF5 snapshots carry no layer types (only "
            "names); give the net they come from (the matching .caffemodel, the same layer names) with ")
    _check_sites([(lambda: blobtool.state_dict(snapshot), f"{snapshot}: names='torch' {rest}net=FILE",
                   ["info", snapshot, "--names", "torch"], f"blobtool: {snapshot}: --names torch {rest}--definition FILE")])


def test_a_library_only_error_names_its_parameter(tmp_path):
    # A blob file written by the Caffe writer itself (api.write refuses more than one blob before).
    from blobtool.cli.group import error_line
    from blobtool.formats.caffe import containers

    doc = open_document(_net_file(tmp_path / "tiny.caffemodel")[0])
    entries = doc.entries[:2]
    with pytest.raises(BlobToolError) as caught:
        containers.write(doc, entries, [e.blob() for e in entries], tmp_path / "o.pb", kind="blob")
    assert str(caught.value) == "a blob file holds one blob; 2 selected (choose one with blobs, or write .npz)"
    assert error_line(caught.value) == "a blob file holds one blob; 2 selected (choose one with --blob, or write .npz)"


def test_a_parameter_named_with_its_value_is_the_commands_flag_or_option_and_value():
    from blobtool.cli.group import option_name
    from blobtool.errors import UsageError, parameter

    exc = UsageError(f"{parameter('layout', given='legacy')}, {parameter('format', given='blob')}, "
                     f"{parameter('write_diff', given=False)}, {parameter('key', True)}ema")
    assert str(exc) == "layout='legacy', format='blob', write_diff=False, key=ema"
    assert exc.parameters == ("layout", "format", "write_diff", "key")
    assert exc.rendered(option_name) == "--layout legacy, --format blob, --no-diff, --key ema"
    seen = []
    exc.rendered(lambda name: seen.append(name) or "")
    assert seen == ["layout='legacy'", "format='blob'", "write_diff=False", "key"]


def test_an_error_lists_the_parameters_it_names(tmp_path):
    net, _ = _net_file(tmp_path / "tiny.caffemodel")
    with pytest.raises(BlobToolError) as caught:
        select(open_document(net), ["nope"])
    assert caught.value.parameters == ("patterns",)
    assert caught.value.rendered(lambda name: "<" + name + ">").startswith(f"{net}: <patterns> 'nope' selects")


def test_state_dict_torch_identifiers_has_the_names_convert_writes(tmp_path):
    from safetensors.numpy import load_file

    from builders import Layer, write_net
    from runner import run_blobtool

    rng = np.random.default_rng(5)
    layers = [Layer(name, "Convolution", [rng.standard_normal((2, 1, 1, 1)).astype(np.float32),
                                          rng.standard_normal(2).astype(np.float32)], bottom=[f"t{k}"],
                    top=[f"t{k + 1}"]) for k, name in enumerate(["conv6-1", "conv6_1", "in", "x+y"])]
    net = write_net(tmp_path / "ids.caffemodel", "new", layers)
    out = tmp_path / "ids.safetensors"
    assert run_blobtool("convert", "--names", "torch-identifiers", net, "-o", out).returncode == 0
    said = []
    got = blobtool.state_dict(net, names="torch-identifiers", warn=said.append)
    expected = load_file(out)
    assert list(got) == list(expected)
    for name, array in expected.items():
        np.testing.assert_array_equal(got[name], array)
    assert said == [f"{net}: --names torch-identifiers: these module names became an identifier already given, "
                    "and were numbered: conv6-1 -> conv6_1_2"]
