"""Every layer type real Caffe has is proved against it, or named here with the reason it is not.

`caffe.layer_type_list()` of the oracle (tests/helpers/caffeoracle.py), less the
layers a deploy net never runs (data, loss, accuracy, solver-only), must be
exactly the types of COVERED, each naming the test that runs it against
Caffe, and LEFT_OUT, each with its reason. A type Caffe gains or blobtool
learns to run makes this test fail until the tables say where it is proved.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

from caffeoracle import shared_worker

pytestmark = pytest.mark.caffe

# Layers a deploy net has no use for: deploy.py makes data layers inputs and drops losses and
# accuracies (docs/running.md, the deploy definition).
NOT_IN_A_DEPLOY_NET = {
    "Data", "AnnotatedData", "DummyData", "HDF5Data", "HDF5Output", "ImageData", "MemoryData", "WindowData",
    "Accuracy", "DetectionEvaluate", "Silence", "Python",
    "ContrastiveLoss", "EuclideanLoss", "HingeLoss", "InfogainLoss", "MultiBoxLoss", "MultinomialLogisticLoss",
    "SigmoidCrossEntropyLoss", "SmoothL1Loss", "SoftmaxWithLoss",
}

# Layer types Caffe has that blobtool does not run yet: run refuses them (exit 3 naming the layer).
LEFT_OUT: dict = {}

# The deploy net's inputs: every deploy definition blobtool writes declares them as Input layers,
# which each net run in Caffe reads (tests/forward/test_caffe_realworld.py); they compute nothing.
INPUTS = {"Input"}

# Type -> the test (module, function) that runs it against Caffe.
COVERED = {
    "Convolution": ("test_layers_spatial", "test_convolution_against_caffe"),
    "Deconvolution": ("test_layers_spatial", "test_deconvolution_against_caffe"),
    "Pooling": ("test_layers_spatial", "test_pooling_sweep_against_caffe"),
    "InnerProduct": ("test_layers_spatial", "test_inner_product_against_caffe"),
    "Embed": ("test_layers_spatial", "test_embed_against_caffe"),
    "ReLU": ("test_layers_elementwise", "test_neuron_against_caffe"),
    "ELU": ("test_layers_elementwise", "test_neuron_against_caffe"),
    "Sigmoid": ("test_layers_elementwise", "test_neuron_against_caffe"),
    "TanH": ("test_layers_elementwise", "test_neuron_against_caffe"),
    "AbsVal": ("test_layers_elementwise", "test_neuron_against_caffe"),
    "BNLL": ("test_layers_elementwise", "test_neuron_against_caffe"),
    "Power": ("test_layers_elementwise", "test_neuron_against_caffe"),
    "Exp": ("test_layers_elementwise", "test_neuron_against_caffe"),
    "Log": ("test_layers_elementwise", "test_neuron_against_caffe"),
    "Threshold": ("test_layers_elementwise", "test_neuron_against_caffe"),
    "Dropout": ("test_layers_elementwise", "test_neuron_against_caffe"),
    "PReLU": ("test_layers_elementwise", "test_prelu_against_caffe"),
    "BatchNorm": ("test_layers_elementwise", "test_batch_norm_against_caffe"),
    "LRN": ("test_layers_elementwise", "test_lrn_against_caffe"),
    "MVN": ("test_layers_elementwise", "test_mvn_against_caffe"),
    "Softmax": ("test_layers_elementwise", "test_softmax_against_caffe"),
    "Normalize": ("test_layers_elementwise", "test_normalize_against_caffe"),
    "Scale": ("test_layers_elementwise", "test_scale_and_bias_against_caffe"),
    "Bias": ("test_layers_elementwise", "test_scale_and_bias_against_caffe"),
    "Eltwise": ("test_layers_elementwise", "test_eltwise_against_caffe"),
    "Reduction": ("test_layers_elementwise", "test_reduction_against_caffe"),
    "ArgMax": ("test_layers_elementwise", "test_argmax_against_caffe"),
    "Concat": ("test_layers_shape", "test_concat"),
    "Slice": ("test_layers_shape", "test_slice"),
    "Split": ("test_layers_shape", "test_split"),
    "Flatten": ("test_layers_shape", "test_flatten"),
    "Reshape": ("test_layers_shape", "test_reshape"),
    "Crop": ("test_layers_shape", "test_crop"),
    "Tile": ("test_layers_shape", "test_tile"),
    "Permute": ("test_layers_shape", "test_permute"),
    "PriorBox": ("test_layers_shape", "test_prior_box"),
    "DetectionOutput": ("test_layers_shape", "test_detection_output"),
    "LSTM": ("test_layers_bvlc", "test_recurrent_as_caffe_and_exported"),
    "RNN": ("test_layers_bvlc", "test_recurrent_as_caffe_and_exported"),
    "LSTMUnit": ("test_layers_bvlc", "test_lstm_unit_as_caffe_and_exported"),
    "SPP": ("test_layers_bvlc", "test_spp_as_caffe_and_exported"),
    "Im2col": ("test_layers_bvlc", "test_im2col_as_caffe_and_exported"),
    "BatchReindex": ("test_layers_bvlc", "test_batch_reindex_as_caffe_and_exported"),
    "Filter": ("test_layers_bvlc", "test_filter_as_caffe_and_exported"),
    "Parameter": ("test_layers_bvlc", "test_parameter_as_caffe_and_exported"),
}


def test_every_caffe_layer_type_is_proved_against_caffe_or_named():
    caffes = set(shared_worker().layer_types()) - NOT_IN_A_DEPLOY_NET
    unplaced = sorted(caffes - set(COVERED) - set(LEFT_OUT) - INPUTS)
    assert not unplaced, f"Caffe has these layer types, which no test runs against it: {unplaced}"
    assert not set(COVERED) & set(LEFT_OUT)
    placed = set(COVERED) | set(LEFT_OUT) | INPUTS
    assert sorted(placed) == sorted(caffes), sorted(placed - caffes)


@pytest.mark.parametrize("kind", sorted(COVERED))
def test_each_covering_test_runs_the_type_against_caffe(kind):
    module_name, function = COVERED[kind]
    module = importlib.import_module(module_name)
    test = getattr(module, function)
    marks = {mark.name for mark in getattr(test, "pytestmark", [])} | \
        {mark.name for mark in getattr(module, "pytestmark", [])}
    assert "caffe" in marks, f"{module_name}.{function} is not a test against Caffe"
    assert f'"{kind}"' in inspect.getsource(module), f"{module_name} never builds a {kind} layer"


def test_the_left_out_types_are_refused_by_run():
    from blobtool.layers import layer_class

    assert all(layer_class(kind) is None for kind in LEFT_OUT), [k for k in LEFT_OUT if layer_class(k) is not None]
    assert all(layer_class(kind) is not None for kind in COVERED)
