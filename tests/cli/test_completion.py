"""Shell completion through the real command: click's protocol (_BLOBTOOL_COMPLETE), blob names after --blob."""

from __future__ import annotations

import json
import os
import pty
import select
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from builders import Layer, write_net, write_npz
from runner import blobtool_cmd, complete, run_blobtool, subprocess_env


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
    assert (values, err, code) == (["--all-files"], "", 0)
    assert complete("norm", "--all-f") == (["--all-files"], "", 0)


# -- names holding characters the shell treats specially -----------------------------------

# Layer names from real nets (a ResNet port's, a quoted one, a path-like one), and worse.
SPECIAL = ["conv4_c1x1-w(s/2)__conv", "a b$x", "tick'q", "back\\slash", "fc[relu]", "both'$`\"!", "new\nline",
           "семь;&"]


@pytest.fixture
def special_net(tmp_path):
    return write_net(tmp_path / "special.caffemodel", "new",
                     [Layer("conv1", "Convolution", [np.ones(2)])]
                     + [Layer(name, "ReLU", [np.ones(2)]) for name in SPECIAL])


def bash_words(line: str, prefix: str = "") -> list:
    """What blobtool's bash completion puts in COMPREPLY for the command line `line` (its last word completed),
    each evaluated by bash after `prefix` (what readline keeps of the word): the words bash would run."""
    script = run_blobtool(env=subprocess_env(_BLOBTOOL_COMPLETE="bash_source"), text=True).stdout
    words = split_line(line)
    program = (f"{script}\nCOMP_WORDS=({' '.join(map(shlex.quote, words))}); COMP_CWORD={len(words) - 1}\n"
               "_blobtool_completion blobtool\n"
               'for word in "${COMPREPLY[@]}"; do eval "printf \'%s\\0\' $PREFIX$word"; done\n')
    with tempfile.TemporaryDirectory() as folder:
        # The completion script runs the program by name (through env): this checkout's, first on PATH.
        program_file = Path(folder) / "blobtool"
        program_file.write_text(f"#!/bin/sh\nexec {' '.join(map(shlex.quote, blobtool_cmd()))} \"$@\"\n")
        program_file.chmod(0o755)
        env = subprocess_env(PREFIX=prefix)
        env["PATH"] = folder + os.pathsep + env.get("PATH", "")
        result = subprocess.run(["bash", "-c", program], env=env, capture_output=True, timeout=60)
    assert result.returncode == 0 and result.stderr == b"", result.stderr
    return result.stdout.decode().split("\0")[:-1]


def split_line(line: str) -> list:
    """A command line's words as bash's COMP_WORDS holds them (as typed, quotes kept): split at blanks outside quotes."""
    words, word, quote = [], "", None
    for char in line:
        if quote is None and char == " ":
            words.append(word)
            word = ""
            continue
        if quote is None and char in "'\"":
            quote = char
        elif char == quote:
            quote = None
        word += char
    return words + [word]


def test_names_with_shell_characters_are_quoted_and_plain_names_are_not(special_net):
    values, err, code = complete("info", special_net, "--blob", "")
    assert (err, code) == ("", 0)
    assert values[:1] == ["conv1/0"]  # unchanged
    assert "'conv4_c1x1-w(s/2)__conv/0'" in values and "'conv4_c1x1-w(s/2)__conv'" in values
    # Every candidate, read back by bash, is the name: each one blob or layer name, whole.
    names = [f"{name}/0" for name in ["conv1", *SPECIAL]] + ["conv1", *SPECIAL]
    assert bash_words(f"blobtool info {special_net} --blob ") == names
    assert bash_words(f"blobtool info {special_net} --blob conv4") == ["conv4_c1x1-w(s/2)__conv/0",
                                                                        "conv4_c1x1-w(s/2)__conv"]
    # zsh quotes what it inserts itself: its candidates are the names as they are.
    assert complete("info", special_net, "--blob", "conv4", shell="zsh")[0] == ["conv4_c1x1-w(s/2)__conv/0",
                                                                               "conv4_c1x1-w(s/2)__conv"]


@pytest.mark.parametrize("typed, prefix", [
    ("'conv4_c1x1-w(s", ""), ('"conv4_c1x1-w(s', ""), ("conv4_c1x1-w\\(s", ""), ("'tick'\\''q", "'tick'\\'"),
    ('"a b\\$', ""), ("\"both'\\$\\`", ""), ("$'new\\nl", "$"), ("семь\\;", "")])
def test_a_partly_typed_quoted_word_completes(special_net, typed, prefix):
    # Readline replaces what follows the quote the word leaves open (`prefix`: what it keeps before it).
    words = bash_words(f"blobtool info {special_net} --blob {typed}", prefix)
    assert words and all(any(word.startswith(name) for name in SPECIAL) for word in words), words
    name = next(name for name in SPECIAL if words[-1] == name)
    assert words == [f"{name}/0", name]


@pytest.mark.slow
def test_real_bash_runs_the_inserted_word(special_net, tmp_path):
    """An interactive bash with blobtool's completion: Tab, then run what it inserted (blobtool info --json)."""
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "blobtool"
    wrapper.write_text("#!/bin/sh\nexec " + " ".join(map(shlex.quote, blobtool_cmd())) + ' "$@"\n')
    wrapper.chmod(0o755)
    env = subprocess_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PS1="$ ", TERM="dumb",
                         INPUTRC="/dev/null", HISTFILE="/dev/null")
    typed = [("--blob conv4\t/\t", "conv4_c1x1-w(s/2)__conv/0"), ("--blob 'tick\t/\t", "tick'q/0"),
             ('--blob "a\t/\t', "a b$x/0"), ("--blob conv\t1/\t", "conv1/0")]
    keys = 'eval "$(_BLOBTOOL_COMPLETE=bash_source blobtool)"\n'
    keys += "".join(f"blobtool info --json {special_net.name} {line}\n" for line, _ in typed) + "exit\n"
    out = interactive_bash(keys, env, special_net.parent)
    ran = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [[blob["name"] for blob in record["blobs"]] for record in ran] == [[name] for _, name in typed], out


def interactive_bash(keys: str, env: dict, cwd) -> str:
    """What an interactive bash on a pseudo-terminal prints while it reads `keys` (typed ahead, all at once)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(["bash", "--norc", "--noprofile", "-i"], stdin=slave, stdout=slave, stderr=slave,
                            env=env, cwd=cwd, start_new_session=True)
    os.close(slave)
    os.write(master, keys.encode())
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: bash is gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    return b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
