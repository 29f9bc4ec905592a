"""Shared by the flow.user_op_builder tests."""
import onnxjob as flow


def build(type_name, inputs=None, outputs=(("out", 1),), name="op", **attrs):
    """One builder op: inputs {arg: [Blob]}, outputs [(arg, num)]; its RemoteBlobList."""
    b = flow.user_op_builder(name).Op(type_name)
    for arg, blobs in (inputs or {}).items():
        b = b.Input(arg, blobs)
    for arg, num in outputs:
        b = b.Output(arg, num)
    for key, value in attrs.items():
        b = b.Attr(key, value)
    return list(b.Build().InferAndTryRun().RemoteBlobList())
