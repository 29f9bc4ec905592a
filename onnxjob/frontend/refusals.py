"""OneFlow names that onnxjob refuses on purpose, by namespace, with the reason.

Each is a multi-device eager op, custom-C++-op-library, multi-node or compiler internal
that a job (or an eager tensor) on one device cannot use; looking one up raises
UnsupportedAPIError with its reason (errors.missing_api). docs/oneflow-scripts.md lists them.
"""

_EAGER = ("an op of OneFlow's eager runtime across placements ({what}); onnxjob's eager "
          "tensors live on one device")
_CUSTOM_OP = ("it loads a custom C++ op library ({what}); onnxjob runs no OneFlow kernels: "
              "write the computation with flow ops in the job (flow.user_op_builder builds "
              "the op types of OneFlow's own library that onnxjob knows)")
_MULTI_NODE = ("a multi-node / multi-device internal of OneFlow ({what}); onnxjob runs a job "
               "on one device per process (python -m onnxjob run --nproc N for data-parallel "
               "ranks)")


_INTERNAL = ("an internal of OneFlow's compiler or session ({what}) that job code does not "
             "use; onnxjob compiles jobs to ONNX graphs instead")


def _internal(what):
    return _INTERNAL.format(what=what)


def _eager(what):
    return _EAGER.format(what=what)


def _custom_op(what):
    return _CUSTOM_OP.format(what=what)


def _multi_node(what):
    return _MULTI_NODE.format(what=what)


REASONS = {
    "flow": {
        "eager_nccl_all_reduce": _multi_node("an eager NCCL all-reduce across devices"),
        **{name: _custom_op(f"flow.{name} is a YOLOv3 op of the OneFlow builds that linked "
                            "the oneflow_yolov3 kernels")
           for name in ("yolo_detect", "yolo_box_diff", "yolo_prob_loss", "yolo_nms")},
        "ConfigProto": _internal("the job set's ConfigProto message, built from flow.config "
                                 "/ flow.env"),
        "JobConfigProto": _internal("the JobConfigProto message, built from "
                                    "flow.FunctionConfig"),
        "variable_scope": ("flow.variable_scope is not a name of released OneFlow: 0.1-0.5 "
                           "export that context as flow.deprecated.variable_scope "
                           "and flow.name_scope (use flow.scope.namespace), which onnxjob "
                           "provides"),
    },
    "flow.keras.activations": {
        name: (f"flow.keras.activations.{name} is a gradient op OneFlow 0.1.0 exported for "
               "its own backward pass; a train job's minimize(loss) differentiates the job")
        for name in ("gelu_grad", "tanh_grad")},
    "flow.experimental": {
        "eager_assign_121": _eager("eager one-to-one assignment between placements"),
        "get_job_set": _internal("the JobSet protobuf OneFlow compiles jobs into"),
    },
    "flow.detection": {"yolo_detect": _custom_op("flow.detection.yolo_detect is a YOLOv3 op of "
                                                 "the OneFlow builds that linked the "
                                                 "oneflow_yolov3 kernels")},
    "flow.deprecated": {
        # OneFlow <= 0.3: copy the binary to each machine over ssh and start / stop workers
        "init_worker": _multi_node("starting worker processes on the machines of flow.env"),
        "delete_worker": _multi_node("stopping the worker processes flow.deprecated."
                                     "init_worker started"),
    },
    "flow.sysconfig": {
        name: (f"flow.sysconfig.{name} gives the paths and flags to compile a custom C++ op "
               "library against OneFlow's headers and shared library; onnxjob has neither "
               "(it runs ONNX graphs on onnxruntime): write the op with flow ops in the job")
        for name in ("get_include", "get_lib", "get_compile_flags", "get_link_flags")},
}


def reasons(namespace):
    """{name: reason} of the names of `namespace` ("flow", "flow.experimental", ...)."""
    return REASONS.get(namespace, {})
