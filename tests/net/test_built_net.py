"""The one walk of blob versions (net/graph.py Versions) and the one built net that run, export and info read.

- Versions against a reference written here from Caffe's rules, value by
  value: each layer's bottoms read the value the last layer before it to
  write that name left (Net::Init's blob_name_to_idx), and the net's
  outputs are the names left in available_blobs (a bottom taken out, a top
  put back), in the order of their last write. The reference simulates the values themselves (a fresh token
  per write) and asks of them, on random wirings with in-place layers,
  several tops, unread and input blobs: who reads what, who reads a value
  last, which values are a name's last, the outputs in their order, and
  what the last values of a few names are computed from.
- info's top shapes (a build for shapes only: FP16 blobs neither
  converted nor copied) equal the shapes a run of the same net computes,
  on the real FP16 MTCNN net.
"""

from __future__ import annotations

import numpy as np
import pytest

import blobtool
from blobtool.net.graph import Versions


def _random_links(rng, layers: int, names: int) -> list:
    """(bottoms, tops) of `layers` layers over blob names "b0".."bN", some in place, some of several tops."""
    links = []
    for _ in range(layers):
        bottoms = tuple(f"b{k}" for k in rng.choice(names, size=rng.integers(0, 3), replace=True))
        if bottoms and rng.random() < 0.4:
            tops = (bottoms[0],) + tuple(f"b{k}" for k in rng.choice(names, size=rng.integers(0, 2)))
        else:
            tops = tuple(f"b{k}" for k in rng.choice(names, size=min(names, rng.integers(1, 3)), replace=False))
        links.append((bottoms, tops))
    return links


def _reference(links: list) -> dict:
    """What Caffe's Net::Init makes of the wiring, by simulating values: a fresh token for each write."""
    value: dict = {}      # name -> the token it holds now (absent: a net input)
    reads, writes = [], []
    for i, (bottoms, tops) in enumerate(links):
        reads.append([value.get(b) for b in bottoms])
        for k, top in enumerate(tops):
            value[top] = (i, k)
        writes.append(list(tops))
    readers: dict = {}
    for i, tokens in enumerate(reads):
        for t in dict.fromkeys(t for t in tokens if t is not None):
            readers.setdefault(t, []).append(i)
    last_reader: dict = {}
    for i, (bottoms, _) in enumerate(links):
        for b, t in zip(bottoms, reads[i]):
            last_reader[("input", b) if t is None else t] = i
    freed = [{b for b, t in zip(bottoms, reads[i]) if last_reader[("input", b) if t is None else t] == i}
             for i, (bottoms, _) in enumerate(links)]
    final = [[value[top][0] == i for top in tops] for i, (_, tops) in enumerate(links)]
    # Net::Init's available_blobs: a name taken out when read, put back when written. Caffe lists what is
    # left by name (a std::set); blobtool in the order of the last write, a layer's tops in first-write order.
    available: dict = {}
    first: list = []
    for i, (bottoms, tops) in enumerate(links):
        for b in bottoms:
            available.pop(b, None)
        for top in tops:
            if top not in first:
                first.append(top)
            available[top] = i
    outputs = sorted(available, key=lambda n: (available[n], first.index(n)))
    return {"reads": reads, "readers": readers, "freed": freed, "final": final, "outputs": outputs}


@pytest.mark.parametrize("seed", range(40))
def test_the_walk_agrees_with_a_simulation_of_caffes_wiring(seed):
    rng = np.random.default_rng(seed)
    links = _random_links(rng, int(rng.integers(1, 14)), int(rng.integers(1, 6)))
    walk, want = Versions(links), _reference(links)
    assert walk.reads == want["reads"]
    assert walk.readers == want["readers"]
    assert walk.freed == want["freed"]
    assert walk.final == want["final"]
    assert walk.outputs == want["outputs"], links
    # needed: the layers a name's last value depends on, followed through the simulation's tokens.
    for name in {t for _, tops in links for t in tops}:
        found, todo = set(), [walk.current[name]]
        while todo:
            i = todo.pop()[0]
            if i not in found:
                found.add(i)
                todo += [t for t in want["reads"][i] if t is not None]
        assert walk.needed([name]) == found


def test_an_in_place_tops_last_value_stays_an_output_and_a_read_one_does_not():
    links = [(("data",), ("a",)), (("a",), ("a",)), (("a",), ("b", "c")), (("b",), ("b",))]
    walk = Versions(links)
    assert walk.outputs == ["c", "b"]  # c's last write (layer 2) comes before b's (layer 3)
    assert walk.freed == [{"data"}, {"a"}, {"a"}, {"b"}]
    assert walk.needed(["c"]) == {0, 1, 2} and walk.needed(["data"]) == set()


def test_info_top_shapes_of_an_fp16_net_are_the_shapes_its_run_computes(realworld):
    from blobtool.formats import open_document
    from blobtool.records import top_shapes

    path = realworld / "mtcnn_det1_half.caffemodel"
    shapes = {"data": (1, 3, 24, 24)}
    with open_document(path) as doc:
        found = top_shapes(doc, shapes)
    ran = blobtool.run(path, shapes=shapes, outputs="all").program
    assert found == {"data": [[1, 3, 24, 24]], **{s.layer.name: [list(t) for t in s.top_shapes] for s in ran.steps}}
    assert ran.half  # the net does store float16 blobs
