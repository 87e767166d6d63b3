"""torchport/prefixes.py: the prefix change found between two files' names, and the one asked for."""

from __future__ import annotations

import pytest

from blobtool.errors import UsageError
from blobtool.formats import Document, Entry
from blobtool.torchport.prefixes import Prefixes, detect, match_documents, renamed_document

PORT = ["conv1.weight", "conv1.bias", "bn1.running_mean", "fc.weight"]

# (names of the first file, names of the second, the change found, how many then match)
CASES = {
    "DataParallel on the second": (PORT, [f"module.{n}" for n in PORT], Prefixes("module.", None), 4),
    "DataParallel on the first": ([f"module.{n}" for n in PORT], PORT, Prefixes(None, "module."), 4),
    "one wrapper for another": ([f"model.{n}" for n in PORT], [f"module.{n}" for n in PORT],
                                Prefixes("module.", "model."), 4),
    "two levels, the longer one matches": (PORT, [f"model.backbone.{n}" for n in PORT],
                                           Prefixes("model.backbone.", None), 4),
    "two levels, the shorter one matches": (["backbone.x", "backbone.y"], ["model.backbone.x", "model.backbone.y"],
                                            Prefixes("model.", None), 2),
    "blobtool's names": (["conv1/0", "conv1/1"], ["net/conv1/0", "net/conv1/1"], Prefixes("net/", None), 2),
    "a buffer the other lacks": (PORT, [f"module.{n}" for n in PORT] + ["module.bn1.num_batches_tracked"],
                                 Prefixes("module.", None), 4),
    "already matching": (PORT, PORT, None, 4),
    "no shared prefix": (PORT, ["a.x", "b.y"], None, 0),
    "a prefix that matches nothing more": (PORT, ["module.other", "module.thing"], None, 0),
    "a partial word is no prefix": (["weight", "bias"], ["xweight", "xbias"], None, 0),
}


@pytest.mark.parametrize("names_a, names_b, change, count", CASES.values(), ids=CASES.keys())
def test_detect(names_a, names_b, change, count):
    assert detect(names_a, names_b) == (change, count)


def _doc(names) -> Document:
    return Document("b.pth", "pt", None, entries=[Entry(n, (1,), "shape", None, False) for n in names])


def test_asked_changes_apply_to_the_second_file_strip_first():
    b = _doc(["module.fc.weight", "head.bias"])
    renamed, change, note = match_documents(_doc(["x"]), b, Prefixes("module.", "model."))
    assert renamed.names() == ["model.fc.weight", "model.head.bias"] and note is None
    assert change == Prefixes("module.", "model.")
    # The document given is left as it was.
    assert b.names() == ["module.fc.weight", "head.bias"]
    # An empty strip asks for no change and turns the search off.
    same, change, note = match_documents(_doc(PORT), _doc([f"module.{n}" for n in PORT]), Prefixes(""))
    assert same.names()[0] == "module.conv1.weight" and note is None


def test_a_change_that_makes_two_names_one_is_refused():
    with pytest.raises(UsageError, match=r"b\.pth: strip_prefix=module\. names two blobs 'fc\.bias' "
                                         r"\(fc\.bias and module\.fc\.bias\)"):
        renamed_document(_doc(["fc.bias", "module.fc.bias"]), Prefixes("module."))
