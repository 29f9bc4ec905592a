"""OneFlow-Benchmark's CNN model files (Classification/cnns), imported unchanged through
the `oneflow` alias (see upstream.py), and the jobs the tests and benchmarks build on them."""
import argparse

import onnxjob as flow
import onnxjob.typing as tp
from upstream import import_upstream, upstream_dir

CNNS = ("Classification", "cnns")

# model -> (module, builder function, input size, learning rate for the 5-step check)
MODELS = {
    "resnet50": ("resnet_model", "resnet50", 224, 0.01),
    "vgg16bn": ("vgg_model", "vgg16bn", 224, 0.0005),
    "alexnet": ("alexnet_model", "alexnet", 224, 0.01),
    "inceptionv3": ("inception_model", "inceptionv3", 299, 0.01),
    "mobilenetv2": ("mobilenet_v2_model", "Mobilenet", 224, 0.01),
    "resnext50": ("resnext_model", "resnext50", 224, 0.0003),
}


def cnns_dir():
    """The upstream cnns directory (skipping the calling test when it is absent)."""
    return upstream_dir(*CNNS)


def model_builder(name):
    """The unchanged upstream builder function of `name` (see MODELS)."""
    module, function, _, _ = MODELS[name]
    return getattr(import_upstream(module, *CNNS), function)


def model_args(fused=False):
    """The `args` namespace the builders read (of_cnn_train_val.py's defaults)."""
    return argparse.Namespace(wd=1.0 / 32768, channel_last=False, fuse_bn_relu=fused,
                              fuse_bn_add_relu=fused, pad_output=False)


def smoothed_labels(labels, logits, classes=1000, eta=0.1):
    """of_cnn_train_val.py's label smoothing: a one-hot of (1 - eta + eta/C, eta/C)."""
    return flow.one_hot(labels, depth=classes, dtype=logits.dtype,
                        on_value=1 - eta + eta / classes, off_value=eta / classes)


def define_jobs(build, args, size, lr, batch, config=None):
    """A train job (upstream loss, SGD momentum 0.875) and a predict job of `build`, both
    with the function_config `config` (default: none)."""
    images_def = tp.Numpy.Placeholder((batch, 3, size, size), dtype=flow.float)

    @flow.global_function(type="train", function_config=config)
    def train_job(images: images_def,
                  labels: tp.Numpy.Placeholder((batch,), dtype=flow.int32)) -> tp.Numpy:
        logits = build(images, args)
        loss = flow.nn.softmax_cross_entropy_with_logits(smoothed_labels(labels, logits), logits)
        loss = flow.math.reduce_mean(loss)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]),
                           momentum=0.875).minimize(loss)
        return loss

    @flow.global_function(type="predict", function_config=config)
    def predict_job(images: images_def) -> tp.Numpy:
        return build(images, args)

    return train_job, predict_job
