"""What blobtool knows of nets, once: the layer types (layertypes.py) and BatchNorm's statistics (batchnorm.py).

The jobs on nets (fold, the way back into a net, --names torch, the layer
table) take these facts from here rather than writing them down again.
"""
