"""The check of a fold or a transplant: the net before and after run on the same input, the outputs kept only if it passes.

What `fold --check` and `transplant --check` do, for blobtool.fold(check=True)
and blobtool.transplant(check=True): every output is written where nothing
reads it (files.Staged), the net it holds runs beside the net it came from
(forward/check.py), and the outputs are put in place only when every blob
agrees. The verdict (a CheckResult) is returned as data; when it fails, its
`withheld` names the outputs left unwritten. A net that cannot run is its
error, saying that nothing was written.
"""

from __future__ import annotations

import contextlib
import io
import os

from ..errors import BlobToolError, parameter
from ..files import Staged
from .common import OptionsRefused, opened_document

__all__ = ["folded_and_checked", "refuse_unchecked_transplant", "refuse_checking_a_definition",
           "transplanted_and_checked"]


def folded_and_checked(doc, outputs: tuple, definition, shapes: dict | None, warn):
    """fold_document of `doc` to `outputs`, proved by running the net before and after; the FoldResult, `check` set."""
    from ..surgery.foldnet import fold_document, output_form

    with Staged(outputs) as staged:
        written = [staged.path(dest) for dest in outputs]
        forms = [output_form(dest, doc) for dest in outputs]
        # Where the check reads the folded net from, when no output holds it.
        extra = [] if "net" in forms else [io.BytesIO()]
        if definition is not None and "definition" not in forms:
            raise OptionsRefused(f"{parameter('check')} with {parameter('definition')} runs the folded definition: "
                                 "give -o FILE.prototxt to write it")
        result = fold_document(doc, *written, *extra, definition=definition)
        nets = [w for w, form in zip(written, forms) if form == "net"] + extra
        texts = [w for w, form in zip(written, forms) if form == "definition"]
        after_name = next((_name(d) for d, form in zip(outputs, forms) if form == "net"), "the folded net")
        if isinstance(nets[0], io.BytesIO):
            nets[0].seek(0)
        verdict = _verdict(doc, nets[0], outputs, after_name, warn, shapes=shapes, before_definition=definition,
                           after_definition=texts[0] if definition is not None else None)
        _place_if_passed(staged, verdict, outputs)
    result.outputs = [_name(dest) for dest in outputs]
    result.check = verdict
    return result


def refuse_unchecked_transplant(dest, format: str | None) -> None:
    """OptionsRefused where transplant's check cannot read back what it writes (standard output, a stream, .npz ...)."""
    if not isinstance(dest, (str, os.PathLike)) or dest == "-" or format not in (None, "protobuf", "hdf5", "same"):
        raise OptionsRefused(f"{parameter('check')} runs the net written: give -o FILE.caffemodel (or .h5)")


def refuse_checking_a_definition(template) -> None:
    """OptionsRefused where transplant's check has no weights to run before: the template is a .prototxt."""
    if template.format == "prototxt":
        raise OptionsRefused(f"{parameter('check')} runs TEMPLATE before and after: {template.path} is a definition "
                             "and holds no weights to run")


def transplanted_and_checked(template, dest, definition, shapes: dict | None, warn, write):
    """`write(path)` (the transplant, to a staged path), then the template and the net written run and compared.

    Returns the CheckResult; `dest` is put in place only when it passes.
    """
    with Staged([dest]) as staged:
        written = staged.path(dest)
        write(written)
        verdict = _verdict(template, written, [dest], _name(dest), warn, shapes=shapes, definition=definition)
        _place_if_passed(staged, verdict, [dest])
    return verdict


def _verdict(before, after_src, outputs, after_name: str, warn, *, shapes, definition=None, before_definition=None,
             after_definition=None):
    """check_nets of `before` and the net in `after_src`; a net that cannot run is its error, naming `outputs` unwritten.

    `definition`, for a transplant: the net whose definition both run when
    either is an HDF5 snapshot (which holds none).
    """
    from ..forward.check import check_nets, not_written

    try:
        with contextlib.ExitStack() as opened:
            after = opened_document(opened, after_src, warn)
            if definition is not None or after_definition is not None:
                if after_definition is None:
                    before_definition = after_definition = (
                        definition if before.format == "hdf5" or after.format == "hdf5" else None)
                else:
                    after_definition = opened_document(opened, after_definition, warn)
            verdict = check_nets(before, after, before_definition=before_definition,
                                 after_definition=after_definition, shapes=shapes)
    except BlobToolError as exc:
        raise not_written(exc, outputs) from exc
    verdict.after = after_name
    return verdict


def _place_if_passed(staged: Staged, verdict, outputs) -> None:
    if verdict.passed:
        staged.place()
    else:
        verdict.withheld = list(outputs)


def _name(dest) -> str:
    return os.fspath(dest) if isinstance(dest, (str, os.PathLike)) else "<stream>"
