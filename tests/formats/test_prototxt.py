"""A net definition in text (.prototxt): known as text in all its forms, and read within bounds stated beforehand."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from google.protobuf import text_format

from blobtool._pb import blobtool_caffe_pb2 as pb
from builders import Layer, net_bytes
from runner import REPO, assert_error, blobtool_cmd, invoke, ok, one_json, subprocess_env

import blobtool
from blobtool.formats import MAX_BLOBS
from blobtool.formats import prototxt
from blobtool.formats.prototxt import MAX_BACKSLASHES, MAX_LINE, MAX_LINES, MAX_MESSAGES, MAX_TOKENS

# (exit code, peak resident KiB, user + system CPU seconds) of the command in argv, as a child of its own.
RUSAGE = ("import resource, subprocess, sys; "
          "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode; "
          "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
          "print(rc, u.ru_maxrss, u.ru_utime + u.ru_stime)")


def child_costs(*args) -> tuple:
    """(exit code, peak resident MiB, CPU seconds) of `blobtool ARGS` in a process of its own."""
    out = subprocess.run([sys.executable, "-c", RUSAGE, *blobtool_cmd(*args)], capture_output=True, text=True,
                         env=subprocess_env(), cwd=REPO, timeout=300, check=True).stdout.split()
    return int(out[0]), int(out[1]) / 1024, float(out[2])


def write(tmp_path, data: bytes, name="net.prototxt"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def prototxt_doc(path):
    return blobtool.open_document(path)


def layer_count(path) -> int:
    return one_json(ok("info", "--json", path))["layers"]


# -- every syntax of a layer is counted -------------------------------------------------------

LAYER_FLOODS = {
    "a list": b"layer: [" + b"{}," * MAX_BLOBS + b"{}]\n",
    "angle brackets": b"layer <>\n" * (MAX_BLOBS + 1),
    "a comment before the brace": b"layer # one more\n{}\n" * (MAX_BLOBS + 1),
    "V1 layers with a colon": b"layers: {}\n" * (MAX_BLOBS + 1),
    "a list of angle brackets over lines": b"layer: [\n" + b"<>,\n" * MAX_BLOBS + b"<>]\n",
}


@pytest.mark.parametrize("name", list(LAYER_FLOODS))
def test_layers_past_the_cap_are_refused_in_every_syntax(tmp_path, name):
    path = write(tmp_path, LAYER_FLOODS[name])
    line = assert_error(invoke("info", path), 3, str(path), f"more than {MAX_BLOBS:,} layers", "line ")
    assert "column " in line


def test_layers_at_the_cap_are_read_in_any_syntax(tmp_path):
    half = MAX_BLOBS // 2
    text = (b'name: "n"\n# the first half as a list\nlayer: [\n' + b'{ name: "a" type: "ReLU" },\n' * (half - 1)
            + b'{ name: "a" }]\n' + b'layer # and the rest\n< name: "b" type: "ReLU" >\n' * half)
    assert layer_count(write(tmp_path, text)) == MAX_BLOBS


TRICKY = [
    # Brackets, quotes and comment marks inside strings and comments are no tokens.
    b'name: "a { layer {"  # layer { layer {\nlayer { name: "x#y" type: \'it\\\'s { \' }\n',
    b'layer { name: "q\\"{" top: "\\\\" } # "\nlayer { name: \'}}\' }\n',
    b"layer: [ { name: \"a\" }, # a comment in the list\n { name: \"b\" } ]\nlayers { name: \"v1\" }\n",
    b'input: "data"\ninput_shape { dim: [1, 3, 8, 8] }\nlayer < name: "p" param < lr_mult: 1 > >\n',
    b'state { phase: TEST }\nlayer { include { phase: TEST } }\nlayer{}layer:{}layer<>',
]


@pytest.mark.parametrize("text", TRICKY)
def test_the_scan_counts_the_layers_protobuf_makes(text):
    net = text_format.Parse(text.decode(), pb.NetParameter())
    assert prototxt._scan(text.decode(), "t") == len(net.layer) + len(net.layers) > 0


def test_the_parsed_layers_are_counted_again(tmp_path, monkeypatch):
    # The last check holds whatever the scan missed: here, a scan that counts nothing.
    monkeypatch.setattr(prototxt, "_scan", lambda content, path: 0)
    path = write(tmp_path, b"layer: [" + b"{}," * MAX_BLOBS + b"{}]\n")
    assert_error(invoke("info", path), 3, str(path), f"holds more than {MAX_BLOBS:,} layers", f"{MAX_BLOBS + 1:,}")


# -- the parse is bounded before it starts ----------------------------------------------------

def list_lines(item: bytes, count: int) -> bytes:
    per = 10_000
    return b"\n".join(item * min(per, count - i) for i in range(0, count, per)) + b"\n"


def test_a_flood_of_tokens_is_refused_before_parsing_naming_where(tmp_path):
    # 8 MB of `data: 1` took 5-6 s here, and was read.
    path = write(tmp_path, b"layer { blobs {\n" + b"data: 1\n" * (MAX_TOKENS // 3 + 1) + b"} }\n")
    code, _, cpu = child_costs("info", path)
    assert code == 3 and cpu < 5  # 0.4-0.65 s measured
    first_past = (MAX_TOKENS - 4) // 3 + 2  # 4 tokens on the first line, then 3 a line
    assert_error(invoke("info", path), 3, f"more than {MAX_TOKENS:,} tokens", f"line {first_past:,}, column 1:")


@pytest.mark.parametrize("name, text, what", [
    ("floats in a list", b"layer { blobs { data: [" + list_lines(b"1,", MAX_TOKENS // 2) + b"1] } }\n",
     f"more than {MAX_TOKENS:,} tokens"),
    ("tops", b"layer {\n" + b'top: "a"\n' * (MAX_TOKENS // 3 + 1) + b"}\n", f"more than {MAX_TOKENS:,} tokens"),
    ("comments", b'name: "x"\n' + b"#\n" * MAX_LINES, f"more than {MAX_LINES:,} lines"),
    ("messages", b"layer {\n" + b"param {}\n" * MAX_MESSAGES + b"}\n", f"more than {MAX_MESSAGES:,} messages"),
    ("blank lines", b'name: "x"\n' + b"\n" * MAX_LINES, f"more than {MAX_LINES:,} lines"),
])
def test_text_past_a_bound_is_refused(tmp_path, name, text, what):
    assert_error(invoke("info", write(tmp_path, text)), 3, what, "line ")


def test_text_just_inside_the_bounds_is_read(tmp_path):
    text = (b"layer {\n" + b"param {}\n" * (MAX_MESSAGES - 1) + b"}\n"
            + b"\n" * (MAX_LINES - MAX_MESSAGES - 8) + b'name: "x"\n')
    assert layer_count(write(tmp_path, text)) == 1


def test_a_long_line_of_escapes_is_refused_in_bounded_memory(tmp_path):
    # 4 MB of "\377" in one string: protobuf's tokenizer held 550-650 MB for it.
    path = write(tmp_path, b'name: "' + b"\\377" * (1 << 20) + b'"\n')
    code, peak, _ = child_costs("info", path)
    assert code == 3 and peak < 200, peak  # 44 MB measured
    assert_error(invoke("info", path), 3, f"a line longer than {MAX_LINE:,} characters", "line 1, column")


def test_escapes_within_the_line_bound_are_read(tmp_path):
    # Many strings of 16,000 escapes each: every line within the bound, protobuf's costs with it.
    line = b'input: "' + b"\\101" * ((MAX_LINE - 16) // 4) + b'"\n'
    path = write(tmp_path, line * 64)
    code, peak, _ = child_costs("info", path)
    assert code == 0 and peak < 300, peak  # 60 MB measured
    with prototxt_doc(path) as doc:
        assert doc.parsed.input[0] == "A" * ((MAX_LINE - 16) // 4)


def test_a_long_run_of_backslashes_is_refused(tmp_path):
    # Protobuf unescapes in time growing with its square: 32,768 in a row took 2.6 s.
    path = write(tmp_path, b'name: "' + b"\\" * 32768 + b'"\n')
    assert_error(invoke("info", path), 3, f"more than {MAX_BACKSLASHES} backslashes in a row", "line 1, column 8")
    text = b'name: "' + b"\\\\" * (MAX_BACKSLASHES // 2) + b'"\nlayer { name: "C:\\\\data\\\\x" }\n'
    with prototxt_doc(write(tmp_path, text, "ok.prototxt")) as doc:
        assert doc.parsed.name == "\\" * (MAX_BACKSLASHES // 2) and doc.layers[0].name == "C:\\data\\x"


def test_a_real_sized_definition_at_the_layer_cap_is_read(tmp_path):
    text = b'name: "n"\ninput: "x"\n' + b"".join(
        b'layer {\n  name: "relu%d"\n  type: "ReLU"\n  bottom: "x"\n  top: "x"\n  include { phase: TEST }\n}\n' % i
        for i in range(MAX_BLOBS))
    path = write(tmp_path, text)
    code, _, cpu = child_costs("info", path)
    assert code == 0 and cpu < 20  # about 1 s measured
    assert layer_count(path) == MAX_BLOBS


# -- text in every form is known as text ------------------------------------------------------

@pytest.mark.parametrize("text", [
    b'layer < name: "a" type: "ReLU" >\n',
    b'layer # the first\n{ name: "a" type: "ReLU" }\n',
    b'layer\n# two comments\n# between\n: { name: "a" type: "ReLU" }\n',
    b'# a deploy definition\n\nlayer <\n  name: "a" type: "ReLU"\n>\n',
    b'layers #v1\n{ name: "a" type: RELU }\n',
])
def test_text_of_any_syntax_is_read_as_text(tmp_path, text):
    path = write(tmp_path, text)
    record = one_json(ok("info", "--json", path))
    assert (record["kind"], record["layers"]) == ("net", 1)
    with prototxt_doc(path) as doc:
        assert doc.format == "prototxt" and doc.layers[0].name == "a"


def test_a_byte_order_mark_is_named(tmp_path):
    path = write(tmp_path, b'\xef\xbb\xbfname: "x"\nlayer { name: "a" type: "ReLU" }\n')
    assert_error(invoke("info", path), 3, str(path), "line 1, column 1", "byte-order mark")


def test_comments_only_are_named_as_text(tmp_path):
    path = write(tmp_path, b"# just a comment\n# another\n\n")
    assert_error(invoke("info", path), 3, str(path), "comments and blanks only")


def test_other_text_is_named_as_text(tmp_path):
    path = write(tmp_path, b"hello world, this is a readme file\nwith two lines of prose in it\n", "README")
    assert_error(invoke("info", path), 3, str(path), "text, but not protobuf's text format")


@pytest.mark.parametrize("name", ["#123456789", "# net: x  "])
def test_a_binary_net_whose_name_reads_as_text_or_a_comment_stays_binary(tmp_path, name):
    # Names of 9 to 13 characters make the length byte a blank: "\n\n#123456789".
    path = tmp_path / "n.caffemodel"
    path.write_bytes(net_bytes("new", [Layer("fc", "InnerProduct", [np.ones((2, 2), np.float32)])], name=name))
    record = one_json(ok("info", "--json", path))
    assert record["name"] == name and record["blobs"][0]["name"] == "fc/0"
