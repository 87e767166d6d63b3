"""Shell completion through the real command: click's protocol (_BLOBTOOL_COMPLETE), blob names after --blob."""

from __future__ import annotations

import os

import numpy as np
import pytest

from builders import Layer, write_net, write_npz
from runner import run_blobtool, subprocess_env


def complete(*words, shell: str = "bash") -> tuple[list, str, int]:
    """What `blobtool WORDS<Tab>` offers (the last word is the one being completed): (values, stderr, exit)."""
    words = ["blobtool", *map(str, words)]
    env = subprocess_env(_BLOBTOOL_COMPLETE=f"{shell}_complete", COMP_WORDS=" ".join(words),
                         COMP_CWORD=str(len(words) - 1))
    result = run_blobtool(env=env, text=True)
    if shell == "bash":
        values = [line.split(",", 1)[1] for line in result.stdout.splitlines() if line]
    else:  # zsh: type, value, help, one line each
        values = result.stdout.splitlines()[1::3]
    return values, result.stderr, result.returncode


@pytest.fixture
def nets(tmp_path):
    one = write_net(tmp_path / "a.caffemodel", "new", [
        Layer("data", "Data", []),
        Layer("conv1", "Convolution", [np.ones((2, 1, 3, 3)), np.ones(2)]),
        Layer("conv2", "Convolution", [np.ones((2, 2, 3, 3))]),
        Layer("ip1", "InnerProduct", [np.ones((4, 8)), np.ones(4)]),
    ])
    other = write_npz(tmp_path / "b.npz", {"conv9": np.ones(3, np.float32), "extra": np.ones(2, np.float32)})
    return one, other


def test_blob_names_of_the_file_on_the_line(nets):
    net, _ = nets
    assert complete("info", net, "--blob", "") == (
        ["conv1/0", "conv1/1", "conv2/0", "ip1/0", "ip1/1", "conv1", "conv2", "ip1"], "", 0)
    assert complete("info", net, "--blob", "ip") == (["ip1/0", "ip1/1", "ip1"], "", 0)
    assert complete("norm", net, "--blob", "conv1/") == (["conv1/0", "conv1/1"], "", 0)
    # Files after the option count too, and so do earlier --blob values' files.
    assert complete("info", "--blob", "conv1", net, "--blob", "c")[0] == ["conv1/0", "conv1/1", "conv2/0", "conv1",
                                                                       "conv2"]
    assert complete("show", net, "--blob", "conv2")[0] == ["conv2/0", "conv2"]
    assert complete("convert", net, "-o", "x.npz", "--blob", "ip1/")[0] == ["ip1/0", "ip1/1"]
    assert complete("info", net, "--blob", "ip", shell="zsh")[0] == ["ip1/0", "ip1/1", "ip1"]


def test_names_of_both_files(nets):
    net, npz = nets
    assert complete("compare", net, npz, "--blob", "conv")[0] == ["conv1/0", "conv1/1", "conv2/0", "conv1", "conv2",
                                                                 "conv9"]
    assert complete("info", "--kind", "npz", npz, "--blob", "")[0] == ["conv9", "extra"]


def test_nothing_for_what_cannot_be_read(tmp_path, nets):
    net, _ = nets
    bad = tmp_path / "bad.caffemodel"
    bad.write_bytes(b"\x0a\xff\xff\xff\xff\x0f")
    folder = tmp_path / "folder"
    folder.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (bad, tmp_path / "missing.caffemodel", folder, fifo, "-"):
        assert complete("info", path, "--blob", "") == ([], "", 0)
    # A bad file beside a good one: the good one's names.
    assert complete("info", bad, net, "--blob", "ip")[0] == ["ip1/0", "ip1/1", "ip1"]
    # No file yet: nothing, quietly.
    assert complete("info", "--blob", "") == ([], "", 0)


def test_options_still_complete(nets):
    values, err, code = complete("info", "--al")
    assert (values, err, code) == (["--all-layers"], "", 0)
