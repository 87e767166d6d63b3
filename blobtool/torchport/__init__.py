"""The PyTorch side of a Caffe net: PyTorch's names for its blobs, what a port needs beyond them, name prefixes.

naming.py names a net's blobs as PyTorch's modules name their tensors
(``--names torch``), from the layer types' rows; metadata.py is what a port
needs that a state dict cannot carry (BatchNorm's eps, a layer's settings,
the renamings made) and the identifiers it asks for; prefixes.py finds the
prefix a wrapper adds ("module.") between two files matched by name.

Reading PyTorch's own files (torch.save's zip checkpoints) is a format,
blobtool.formats.pytorch: the registry below this package opens them.
"""
