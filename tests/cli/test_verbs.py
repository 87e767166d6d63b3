"""One verb per job: each command's options, walked in pairs against the rules it declares (cli/rules.py).

For every command, every option alone and every pair of its options is run
on a small net: where a declared rule says the combination does not apply,
the run must be exit 2 with one line naming the option; where none does,
no rule may fire. The old spellings are refused with one line naming the
command that took them over, or rewritten where they are only short forms.
"""

from __future__ import annotations

import itertools
import json

import click
import numpy as np
import pytest

import blobtool
from blobtool.cli import COMMANDS, cli
from blobtool.cli.paths import INPUT, OUTPUT
from blobtool.cli.rules import Needs, Verb
from builders import Layer, write_net
from runner import assert_error, assert_usage, invoke, ok

# What a rule's refusal says (rules.py), and nothing else does.
RULE_WORDS = ("applies only with", "does not apply with")
MOST_OPTIONS = 16   # with --help: a screen of help (transplant: --check and its --input-shape are the 15th and 16th)


def _net(tmp_path):
    rng = np.random.default_rng(0)
    layers = [Layer("conv1", "Convolution", [rng.standard_normal((2, 1, 3, 3)).astype(np.float32),
                                             rng.standard_normal(2).astype(np.float32)],
                    bottom=["data"], top=["conv1"]),
              Layer("bn1", "BatchNorm", [np.ones(2, np.float32), np.ones(2, np.float32),
                                         np.ones(1, np.float32)], bottom=["conv1"], top=["conv1"]),
              Layer("ip1", "InnerProduct", [rng.standard_normal((3, 8)).astype(np.float32)],
                    bottom=["conv1"], top=["ip1"])]
    return write_net(tmp_path / "net.caffemodel", "new", layers)


def _options(command) -> list:
    return [p for p in command.params if isinstance(p, click.Option) and p.name != "help"]


def _sample(option: click.Option, tmp_path, net) -> list:
    """A value for `option` that its type takes (a non-default choice), as command-line tokens."""
    flag = max(option.opts, key=len)
    if option.is_flag:
        return [flag]
    kind = option.type
    if isinstance(kind, click.Choice):
        value = next(c for c in kind.choices if c != option.default)
    elif isinstance(kind, click.IntRange) or kind is click.INT:
        value = "1"
    elif isinstance(kind, click.types.FloatParamType) or kind.name == "tolerance":
        value = "0.5"
    elif kind is INPUT:
        value = str(net)
    elif kind is OUTPUT:
        value = str(tmp_path / ("out.png" if option.metavar == "PATH.png" else "out.caffemodel"))
    else:
        value = "x"
    return [flag, value]


def _arguments(command, net) -> list:
    return {"compare": [net, net], "scale": [net, "2"], "transplant": [net, net], "devices": [],
            "export": [net, "-o", f"{net}.onnx"]}.get(command.name, [net])


def _refused(command: Verb, given: dict) -> str | None:
    """The option the declared rules refuse among `given` ({name: value}), by the rules' own words: or None."""
    # click 8.2+ marks a default not given as a sentinel (UNSET): a flag's unset default is off.
    unset = getattr(click.core, "UNSET", None)
    values = {p.name: (None if p.default is unset and unset is not None else p.default) if not p.multiple else ()
              for p in command.params}
    values.update(given)
    for name in given:
        for rule in command.settings.rules.get(name, ()):
            value = values.get(rule.other)
            if isinstance(rule, Needs):
                fine = (rule.values(value) if callable(rule.values) else
                        value in rule.values if rule.values else value not in (None, False, (), ""))
            else:
                fine = (rule.other not in given if not rule.values else
                        not (rule.values(value) if callable(rule.values) else value in rule.values))
            if not fine:
                return name
    return None


def _value(option: click.Option, tokens: list):
    if option.is_flag:
        return option.flag_value if option.flag_value is not None else True
    return option.type.convert(tokens[1], None, None) if not isinstance(option.type, click.Path) else tokens[1]


def _combinations(command):
    options = _options(command)
    yield from ((o,) for o in options)
    yield from itertools.combinations(options, 2)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_every_pair_of_options_is_refused_exactly_where_a_rule_says_it_does_not_apply(command, tmp_path):
    net = _net(tmp_path)
    assert isinstance(command, Verb), f"{command.name} is not built with rules.verb"
    walked = refused = 0
    for combination in _combinations(command):
        tokens = {o.name: _sample(o, tmp_path, net) for o in combination}
        given = {o.name: _value(o, tokens[o.name]) for o in combination}
        args = [command.name, *_arguments(command, net), *itertools.chain(*tokens.values())]
        result = invoke(*args)
        walked += 1
        expected = _refused(command, given)
        if expected is None:
            assert not any(words in result.stderr for words in RULE_WORDS), (args, result.stderr)
            continue
        refused += 1
        option = command.option_of(expected)
        line = assert_usage(result, command.name, option)
        assert any(words in line for words in RULE_WORDS), line
    assert walked == len(_options(command)) * (len(_options(command)) + 1) // 2
    # A command with rules has combinations they refuse: the walk is not empty of them.
    assert refused or not command.settings.rules


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_every_command_lists_at_most_sixteen_options(command):
    result = invoke(command.name, "--help")
    assert result.exit_code == 0
    listed = [p for p in command.get_params(click.Context(command)) if isinstance(p, click.Option) and not p.hidden]
    assert len(listed) <= MOST_OPTIONS, [max(p.opts, key=len) for p in listed]


@pytest.mark.parametrize("args, fragment", [
    (["convert", "{net}", "--no-fold", "-o", "{out}.npz"], "--no-fold applies only with --names torch"),
    (["convert", "{net}", "--definition", "{net}", "-o", "{out}.npz"], "--definition applies only with --names torch"),
    (["convert", "{net}", "--strict", "-o", "{out}.npz"], "--strict applies only with --precision half"),
    (["info", "{net}", "--layers", "--names", "torch"], "--layers does not apply with --names torch"),
    (["definition", "{net}", "--strict", "-o", "{out}.caffemodel"], "--strict applies only with a text output"),
    (["transplant", "{net}", "{net}", "--no-fold", "-o", "{out}.caffemodel"], "--no-fold applies only with"),
    (["compare", "{net}", "{net}", "-q", "--json"], "--quiet does not apply with --json"),
    (["norm", "{net}", "--jobs", "2", "--device", "0"], "--jobs does not apply with --device"),
    (["show", "{net}", "--width", "40", "-o", "{out}.png"], "--width does not apply with --output"),
])
def test_an_option_that_does_not_apply_is_exit_2_naming_it(args, fragment, tmp_path):
    net = _net(tmp_path)
    assert_usage(invoke(*[a.format(net=net, out=tmp_path / "out") for a in args]), args[0], fragment)


@pytest.mark.parametrize("args, fragment", [
    (["convert", "{net}", "--into", "{net}", "-o", "{out}"], "blobtool transplant SOURCE TEMPLATE -o OUT"),
    (["convert", "{net}", "--partial", "-o", "{out}"], "--partial is transplant's now"),
    (["convert", "{net}", "--rename", "a=b", "-o", "{out}"], "blobtool edit NET -o OUT --rename OLD=NEW"),
    (["convert", "{net}", "--drop", "ip1", "-o", "{out}"], "blobtool edit NET -o OUT --drop LAYER"),
    (["convert", "{net}", "-o", "{out}.prototxt"], "blobtool definition NET -o"),
    (["convert", "{net}", "--device", "0", "-o", "{out}"], "convert computes nothing a GPU could run"),
    (["info", "{net}", "--net", "{net}"], "--net is now --definition PATH"),
    (["info", "{net}", "--all-layers"], "--all-layers is now --layers"),
    (["convert", "{net}", "--net={net}", "-o", "{out}"], "--net is now --definition PATH"),
])
def test_an_old_spelling_is_refused_naming_its_new_place(args, fragment, tmp_path):
    net = _net(tmp_path)
    out = tmp_path / "out"
    assert_usage(invoke(*[a.format(net=net, out=out) for a in args]), args[0], fragment)
    assert not any(p.name.startswith("out") for p in tmp_path.iterdir())


def test_short_forms_of_convert_still_work(tmp_path):
    net = _net(tmp_path)
    for short, long in ((["--double"], ["--precision", "double"]), (["--half-strict"], ["--precision", "half",
                                                                                         "--strict"]),
                        (["--legacy"], ["--layout", "legacy"])):
        a, b = tmp_path / "a.caffemodel", tmp_path / "b.caffemodel"
        ok("convert", net, *short, "-o", a)
        ok("convert", net, *long, "-o", b)
        assert a.read_bytes() == b.read_bytes()
    # A short form and the long one asking for two values is refused, not the last taken.
    assert_usage(invoke("convert", net, "--bf16", "--half-strict", "-o", tmp_path / "x.safetensors"), "convert",
                 "--precision is asked for twice, as bf16 and as half")
    # After "--" a token is an argument, never a short form.
    result = invoke("convert", net, "-o", tmp_path / "c.caffemodel", "--", "--double")
    assert result.exit_code == 2 and "unexpected extra argument" in result.stderr.lower()


def test_scale_takes_negative_factors_and_names_unknown_options(tmp_path):
    net = _net(tmp_path)
    out = tmp_path / "s.caffemodel"
    ok("scale", net, "-0.5", "-o", out)
    assert np.array_equal(blobtool.load_all(out)["conv1/0"].cpu_data(),
                          np.float32(-0.5) * blobtool.load_all(net)["conv1/0"].cpu_data())
    ok("scale", net, "2", "--diff-factor", "-3", "-o", out)
    ok("scale", "-o", out, net, "-1e-3")
    assert_usage(invoke("scale", net, "2", "--bogus", "-o", out), "scale", "No such option '--bogus'")


def test_the_group_lists_commands_by_job_and_every_input_it_reads():
    text = invoke("--help").stdout
    sections = [line.rstrip(":") for line in text.splitlines() if line and not line.startswith(" ")
                and line.endswith(":")]
    assert sections[-4:] == ["Inspect", "Blob math", "Re-encode", "Nets"]
    listed = {line.split()[0] for line in text.splitlines() if line.startswith("  ") and line.split()
              and line.split()[0] in cli.commands}
    assert listed == set(cli.commands)
    for extension in (".caffemodel", ".solverstate", ".prototxt", ".npy", ".npz", ".safetensors", ".pt", ".pth",
                      ".caffemodel.h5", ".binaryproto"):
        assert extension in text, extension


# -- what a new user met --------------------------------------------------------------------------------

def _bn_net(tmp_path, factor=999.98, stored=None):
    """conv1 -> bn1 -> scale1; bn1's sums are its statistics times `factor`, stored with the factor `stored`."""
    rng = np.random.default_rng(1)
    layers = [Layer("conv1", "Convolution", [rng.standard_normal((2, 1, 3, 3)).astype(np.float32)],
                    bottom=["data"], top=["conv1"]),
              Layer("bn1", "BatchNorm", [(rng.standard_normal(2) * factor).astype(np.float32),
                                         (rng.uniform(0.5, 2, 2) * factor).astype(np.float32),
                                         np.array([factor if stored is None else stored], np.float32)],
                    bottom=["conv1"], top=["conv1"]),
              Layer("scale1", "Scale", [rng.uniform(0.5, 1.5, 2).astype(np.float32),
                                        rng.standard_normal(2).astype(np.float32)], bottom=["conv1"], top=["conv1"])]
    return write_net(tmp_path / "bn.caffemodel", "new", layers)


def test_a_round_trip_through_pytorch_compares_equal_as_caffe_computes(tmp_path):
    net = _bn_net(tmp_path)
    port, back = tmp_path / "port.safetensors", tmp_path / "back.caffemodel"
    ok("convert", "--names", "torch", net, "-o", port)
    ok("transplant", port, net, "--names", "torch", "-o", back)
    # The factor went back as 1, the sums divided by it: the blobs differ, what Caffe computes does not.
    assert blobtool.load_all(back)["bn1/2"].cpu_data()[0] == 1
    result = invoke("compare", back, net, "--rtol", "1e-6", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"blobtool: {back}, {net}: BatchNorm statistics compared as Caffe uses them, each net's sums divided by its "
        "own factor (blob 2); the 1 factor blob not compared on their own"]
    compared = {b["name"]: b.get("compared") for b in json.loads(result.stdout)["blobs"]}
    assert compared == {"conv1/0": None, "bn1/0": "divided by the factor", "bn1/1": "divided by the factor",
                        "bn1/2": "not compared", "scale1/0": None, "scale1/1": None}
    # Sums a thousand times apart with factors alike compute alike; the same sums with another factor do not.
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    assert invoke("compare", _bn_net(tmp_path / "one", factor=1.0), net, "--rtol", "1e-6").exit_code == 0
    assert invoke("compare", _bn_net(tmp_path / "two", stored=2 * 999.98), net, "--rtol", "1e-6").exit_code == 1


def test_a_transplant_of_pytorch_names_without_names_torch_says_to_add_it(tmp_path):
    net = _bn_net(tmp_path)
    port = tmp_path / "port.safetensors"
    ok("convert", "--names", "torch", net, "-o", port)
    line = assert_error(invoke("transplant", port, net, "-o", tmp_path / "o.caffemodel"), 3,
                        "the values are named as PyTorch names them: --names torch matches them by PyTorch's names")
    # The lists are cut short: the line stays short whatever the temporary folder's path.
    assert len(line.replace(str(tmp_path), "")) < 300 and not (tmp_path / "o.caffemodel").exists()


def test_fold_of_a_net_without_batchnorm_says_so(tmp_path):
    net = _net(tmp_path)
    rng = np.random.default_rng(2)
    plain = write_net(tmp_path / "plain.caffemodel", "new", [
        Layer("conv1", "Convolution", [rng.standard_normal((2, 1, 3, 3)).astype(np.float32)], bottom=["data"],
              top=["conv1"])])
    result = ok("fold", plain, "-o", tmp_path / "f.caffemodel")
    assert (f"blobtool: warning: {plain}: the net has no BatchNorm layer: nothing to fold, so each output holds the "
            "net as it is") in result.stderr.splitlines()
    assert "no BatchNorm layer" not in ok("fold", net, "-o", tmp_path / "g.caffemodel").stderr


@pytest.mark.parametrize("command", ["info", "norm", "compare"])
def test_blob_takes_pytorch_names_with_names_torch(command, tmp_path):
    net = _bn_net(tmp_path)
    args = [net, net] if command == "compare" else [net]
    result = ok(command, *args, "--names", "torch", "--blob", "bn1.running_var", "--json")
    record = json.loads(result.stdout.splitlines()[0])
    if command == "info":
        # info lists the renaming: the Caffe blob and the factor divided into it, which has no name.
        assert [(b["name"], b["torch"]) for b in record["blobs"]] == [("bn1/1", "bn1.running_var"), ("bn1/2", None)]
        record = json.loads(ok(command, *args, "--names", "torch", "--stats", "--blob", "bn1.running_var",
                               "--json").stdout)
    assert [b["name"] for b in record["blobs"]] == ["bn1.running_var"]
    # The file's own names still select first: the layer bn1 is its BatchNorm's tensors.
    record = json.loads(ok(command, *args, "--names", "torch", "--blob", "bn1", "--json").stdout.splitlines()[0])
    assert "bn1.running_var" in [b.get("torch", b["name"]) for b in record["blobs"]]
    assert_error(invoke(command, *args, "--names", "torch", "--blob", "bn9.*"), 3, "--blob 'bn9.*' selects nothing")
