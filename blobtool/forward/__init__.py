"""Running a Caffe net without Caffe: its deploy net (deploy.py), built and run layer by layer (runner.py).

The layers themselves, one class per Caffe type, are blobtool/layers/;
this package takes a net's definition and weights from any net blobtool
reads, makes the deploy net Caffe's TEST phase runs, checks every layer and
shape before computing, and runs it in float32.
"""
