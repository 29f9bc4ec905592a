"""Quantization-aware training: `function_config.enable_qat(True)`.

OneFlow 0.5 rewrites the job's forward graph with its QuantAwareTraining pass
(oneflow/core/job_rewriter/quantization_aware_training.cpp), before autodiff, in train
and predict jobs alike. onnxjob applies the same rules while the job is traced, at the
OneFlow ops they name (the hooks below, called by conv.py, linalg.py, math.py, shapes.py
and layers.py), and through the graph builder's input hook (`QatTracer.consume`) for
the consumers of quantized outputs:

1. White ops. The int8 ops are conv2d, matmul (2-D flow.matmul, flow.layers.dense),
   batch_matmul (flow.matmul of equal ranks > 2), add_n (flow.math.add_n, and
   flow.math.add / `+` of two Blobs of one shape), avg_pool_2d and max_pool_2d for
   target_backend "", conv2d and matmul for "tensorrt" and "cambricon", conv2d alone for
   "tensorrt7" (OneFlow 0.4's name and list for its TensorRT backend). A conv2d whose
   output has one consumer draws in the bias_add, normalization
   (flow.layers.batch_normalization) and relu (flow.math.relu, flow.nn.relu) after it,
   each also with one consumer: the conv chain. Reshapes of white outputs are white too
   ("", "tensorrt" and "tensorrt7" only); scales pass through them.
2. An input of a white op that comes from a non-white op is fake-quantized when the
   op's scope allows it (`flow.experimental.scope.config(quantization_aware_training=
   False)` does not): a variable (a weight) through min_max_observer, per channel of axis
   0 with qat.per_channel_weight_quantization; any other blob through
   moving_average_min_max_observer. The bias of a conv2d (its bias input, or the
   bias_add of its chain) gets the product of the conv's input and weight scales and a
   zero point variable of zeros; normalization's parameters stay as they are.
3. "", "tensorrt" and "tensorrt7" fake-quantize the output of each int8 op (for a conv2d, of its
   chain's last op) for all of its consumers, the job's outputs included, when that
   op's scope allows; "cambricon" quantizes every float input of an enabled int8 op
   instead, those from white ops too.
4. 8 bits, float32 blobs only; "symmetric" or "affine" (qat.symmetric); the "google"
   formula, or "cambricon" (a power-of-two shift) for that backend.
5. A moving-average observer keeps variables `<blob>-fake-quant-observer-fake-quant-
   moving-max` / `-min` (zeros at first, saved in checkpoints); a train job updates them
   (ops/quantization.py: _moving_min_max) while OneFlow's train step (the
   `System-Train-TrainStep-<job>` variable, 0 in the first run) is at most
   qat.moving_min_max_stop_update_after_iters, a predict job only reads them. Each blob
   gets one observer whichever ops read it, named after the blob (its name with "/" as
   "-"), so a predict job whose blobs have the train job's names reads its statistics.

NOTE: A conv chain is decided when its next op is traced, before later consumers are
known: an output read again after a chain op took it stays in the chain (with a
warning), where OneFlow would end the chain at it.
"""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.frontend import initializers, scope
from onnxjob.frontend.config import QAT_DEFAULTS
from onnxjob.frontend.variables import VariableSpec, variable_blob
from onnxjob.graph.tracer import current_builder, in_job, op
from onnxjob.ops import quantization
from onnxjob.source_info import called_from_user, user_location, warn_at_user_line

BIT = 8
_INT8_OPS = {"": {"add_n", "matmul", "batch_matmul", "conv2d", "avg_pool_2d", "max_pool_2d"},
             "tensorrt": {"conv2d", "matmul"}, "cambricon": {"conv2d", "matmul"},
             "tensorrt7": {"conv2d"}}
# the ops that may follow each op of a conv chain (GetInferenceOutputNode's order)
_NEXT = {"conv2d": ("bias_add", "normalization", "relu"),
         "bias_add": ("normalization", "relu"), "normalization": ("relu",), "relu": ()}


class QatSettings:
    """A job's QatConfig (function_config.qat.*, OneFlow's defaults where unset)."""

    def __init__(self, config):
        def get(name):
            return config.get("qat." + name, QAT_DEFAULTS[name])
        self.per_channel = get("per_channel_weight_quantization")
        self.scheme = "symmetric" if get("symmetric") else "affine"
        self.momentum = get("moving_min_max_momentum")
        self.stop_update_after_iters = get("moving_min_max_stop_update_after_iters")
        self.backend = get("target_backend")
        self.formula = "cambricon" if self.backend == "cambricon" else "google"
        self.int8_ops = _INT8_OPS[self.backend]
        # "", "tensorrt" and "tensorrt7": outputs of int8 ops are quantized and reshapes
        # are transparent
        self.quantize_outputs = self.backend != "cambricon"


class _Site:
    """One white op being traced: what `done` needs when its output is there."""

    __slots__ = ("tracer", "kind", "op_type", "inputs", "enabled", "conv", "bias")

    def __init__(self, tracer, kind, op_type, inputs, enabled, conv=None, bias=None):
        self.tracer, self.kind, self.op_type = tracer, kind, op_type
        self.inputs, self.enabled = inputs, enabled
        self.conv = conv      # (input, weight) of the conv2d heading the chain
        self.bias = bias      # the chain bias_add's bias as the op reads it


def _scope_enabled():
    return bool(scope.current_scope_attrs()["quantization_aware_training"])


class QatTracer:
    """The QAT state of one job while its body is traced (`builder.qat`)."""

    def __init__(self, builder, settings, training):
        self.builder, self.s, self.training = builder, settings, training
        # each dict maps id(Blob) to the Blob (kept, so ids stay unique) or its record
        self.white = {}      # outputs of white ops (rule 1)
        self.pending = {}    # outputs quantized for every consumer (rule 3)
        self.heads = {}      # conv chain ends no op has read yet -> (op type, conv)
        self.interior = {}   # chain outputs that the next chain op took
        self.quantized = {}  # blob -> its fake-quantized Blob (one per blob)
        self.scales = {}     # blob -> its scale Blob (OneFlow's scale_map)
        self.warned = set()
        self.busy = False    # emitting observers: the input hook stands aside
        self.uses_train_step = False

    # -- the graph builder's input hook -------------------------------------------------
    def consume(self, inputs):
        """`inputs` of a node being emitted, each pending output replaced by its
        fake-quantized value (rule 3); records that the others were read."""
        if self.busy:
            return inputs
        out = None
        for i, x in enumerate(inputs):
            if x is None:
                continue
            self._read(x)
            if id(x) in self.pending:
                if out is None:
                    out = list(inputs)
                out[i] = self._quantize(x)
        return inputs if out is None else out

    def _read(self, x):
        key = id(x)
        self.heads.pop(key, None)
        if key in self.interior and key not in self.warned:
            self.warned.add(key)
            warn_at_user_line(
                f"{user_location()}: {x.name} is read again after the next op of its "
                "convolution chain (bias_add, batch normalization, relu) took it; OneFlow's "
                "QAT would end the chain at it, onnxjob keeps the chain (docs/quantization.md)")

    # -- rule 1 and 2: white ops ------------------------------------------------------------
    def int8(self, op_type, inputs, roles=None):
        """The site of int8 op `op_type` reading `inputs` (roles "in", "weight", "bias"),
        its inputs quantized by rules 2 and 3; None when the backend's list lacks it."""
        if op_type not in self.s.int8_ops:
            return None
        enabled = _scope_enabled()
        roles = roles or ["in"] * len(inputs)
        out = list(inputs)
        for i, (x, role) in enumerate(zip(inputs, roles)):
            if x is None or role == "bias":
                continue
            self._read(x)
            if id(x) in self.pending or (enabled and self._from_outside(x)):
                out[i] = self._quantize(x)
        for i, (x, role) in enumerate(zip(inputs, roles)):
            if x is not None and role == "bias":
                self._read(x)
                if enabled and self._from_outside(x):
                    out[i] = self._quantize_bias(x, inputs[0], inputs[1])
        conv = (inputs[0], inputs[1]) if op_type == "conv2d" else None
        return _Site(self, "int8", op_type, out, enabled, conv=conv)

    def _from_outside(self, x):
        """Whether an enabled int8 op quantizes input `x` itself: one from a non-white op,
        or with "cambricon" any input."""
        return id(x) not in self.white or not self.s.quantize_outputs

    def chain(self, op_type, x, bias=None):
        """The site of `op_type` ("bias_add", "normalization", "relu") reading `x`, when
        it continues the conv chain `x` ends (rule 1; its bias quantized by rule 2);
        None otherwise: the op is then not white."""
        head = self.heads.get(id(x))
        if head is None or op_type not in _NEXT[head[0]]:
            return None
        del self.heads[id(x)]
        self.pending.pop(id(x), None)
        enabled = _scope_enabled()
        site = _Site(self, "chain", op_type, [x], enabled, conv=head[1], bias=bias)
        if bias is not None:
            self._read(bias)
            if enabled and id(bias) not in self.white:
                site.bias = self._quantize_bias(bias, *head[1])
        return site

    def transparent(self, x):
        """The site of a reshape of `x` when `x` is white (rule 1), else None."""
        if not self.s.quantize_outputs or id(x) not in self.white:
            return None
        return _Site(self, "transparent", "reshape", [x], _scope_enabled())

    def done(self, site, out):
        """`out`, the output of white op `site`: recorded, and pending (rule 3) where its
        op ends what it quantizes."""
        self.white[id(out)] = out
        if site.kind == "transparent":
            x = site.inputs[0]
            if id(x) in self.scales:
                self.scales[id(out)] = self.scales[id(x)]
            return out
        if site.kind == "chain":
            self.interior[id(site.inputs[0])] = site.inputs[0]
        if site.conv is not None and _NEXT[site.op_type]:
            self.heads[id(out)] = (site.op_type, site.conv)
        if self.s.quantize_outputs and site.enabled:
            self.pending[id(out)] = out
        return out

    def add(self, x, y, name=None, user_call=False):
        """x + y of two Blobs, as OneFlow's flow.math.add: an add_n (an int8 op) when they
        have one shape and are both static or both dynamic. `user_call` (for `+`): only
        where the user wrote it; onnxjob's own lowerings add with `+` where OneFlow's
        kernels add inside."""
        if x.shape != y.shape or x.is_dynamic != y.is_dynamic or (
                user_call and not called_from_user(2)):
            return op("Add", x, y, name=name)
        site = self.int8("add_n", [x, y])
        if site is None:
            return op("Add", x, y, name=name)
        return self.done(site, op("Add", *site.inputs, name=name))

    # -- observers and fake quantization ----------------------------------------------
    def _quantize(self, blob):
        """`blob` fake-quantized (once per blob): a variable by min_max_observer, any
        other blob by a moving-average observer (rule 2). Non-float32 blobs stay."""
        key = id(blob)
        if key in self.quantized:
            return self.quantized[key]
        if blob.np_dtype != np.float32:
            return blob
        base = blob.name.replace("/", "-")
        s = self.s
        self.busy = True
        try:
            if any(v is blob for v in self.builder.variables.values()):
                scale, zero_point = quantization.min_max_observer(
                    blob, BIT, s.scheme, s.formula, per_layer_quantization=not s.per_channel)
            else:
                scale, zero_point = self._moving_observer(blob, base + "-fake-quant-observer")
            out = quantization.fake_quantization(blob, scale, zero_point, BIT, s.scheme,
                                                 s.formula, name=base + "-fake-quant")
        finally:
            self.busy = False
        self.quantized[key], self.scales[key] = out, scale
        return out

    def _moving_observer(self, blob, name):
        s = self.s
        if s.stop_update_after_iters is None:
            raise TraceError(
                f"quantization-aware training observes {blob.name} with a moving average, "
                "which needs function_config.qat.moving_min_max_stop_update_after_iters(n) "
                "(OneFlow: Check failed: qat_config.has_moving_min_max_stop_update_after_iters())")
        moving_max, moving_min = (_zeros_variable(name + suffix, 1, np.float32) for suffix in
                                  ("-fake-quant-moving-max", "-fake-quant-moving-min"))
        if self.training:
            step = variable_blob(VariableSpec(
                f"System-Train-TrainStep-{self.builder.job_name}", (1,), np.int64,
                initializers.constant_initializer(0), trainable=False))
            self.uses_train_step = True
        else:
            # OneFlow gives a predict job's observer a step variable of its own (unread)
            step = _zeros_variable(name + "-fake-train-step", 1, np.int64)
        return quantization._moving_min_max(
            blob, moving_max, moving_min, step, s.stop_update_after_iters, self.training, BIT,
            s.scheme, s.formula, s.momentum)

    def _quantize_bias(self, bias, conv_input, conv_weight):
        """A conv's bias fake-quantized with scale input scale * weight scale and a zero
        point variable of zeros (IsConvBiasEdge)."""
        key = id(bias)
        if key in self.quantized:
            return self.quantized[key]
        if bias.np_dtype != np.float32:
            return bias
        for what, blob in (("input", conv_input), ("weight", conv_weight)):
            if id(blob) not in self.scales:
                raise TraceError(
                    f"quantization-aware training quantizes the bias {bias.name} of a "
                    f"convolution with the scales of its input and weight, but its {what} "
                    f"{blob.name} is not quantized (an op before it has "
                    "quantization_aware_training=False in its scope); OneFlow fails here "
                    "too (Check failed in GetScaleLbn)")
        base = bias.name.replace("/", "-")
        length = conv_weight.shape[0] if self.s.per_channel else 1
        self.busy = True
        try:
            scale = op("Mul", self.scales[id(conv_input)], self.scales[id(conv_weight)],
                       name=base + "-fake-quant-mul-bias")
            zero_point = _zeros_variable(base + "-fake-quant-zp", length, np.float32)
            out = quantization.fake_quantization(bias, scale, zero_point, BIT, self.s.scheme,
                                                 self.s.formula, name=base + "-fake-quant")
        finally:
            self.busy = False
        self.quantized[key], self.scales[key] = out, scale
        return out

    # -- the end of the trace ------------------------------------------------------------
    def close(self, outputs, optimizer=None):
        """The job's output Blobs with rule 3 applied (OneFlow's return ops read the
        quantized values); the hooks stop here, before autodiff."""
        outputs = [self._quantize(b) if id(b) in self.pending else b for b in outputs]
        for b in outputs:
            self._read(b)
        self.builder.qat = None
        members = optimizer._members() if optimizer is not None else []
        if self.uses_train_step and any(getattr(m, "train_step_lbn", None) for m in members):
            raise TraceError(
                "quantization-aware training reads OneFlow's own train step "
                f"(System-Train-TrainStep-{self.builder.job_name}) while tracing; an optimizer "
                "with train_step_lbn is not supported with function_config.enable_qat",
                location=getattr(self.builder.job_function, "location", None))
        return outputs


def _zeros_variable(name, length, np_dtype):
    """OneFlow's Get1DZeroVariableOpConf: a (length,) variable of zeros (not trained:
    nothing reaches it through the straight-through gradient)."""
    return variable_blob(VariableSpec(name, (length,), np_dtype,
                                      initializers.zeros_initializer(), trainable=False))


# -- for the op modules ------------------------------------------------------------------

def start(builder, job):
    """Install the QatTracer of `job` on `builder` when its config enables QAT."""
    config = job.config
    if not config.get("enable_qat", False):
        return
    settings = QatSettings(config)
    where = getattr(job, "location", None)
    if config.get("enable_auto_mixed_precision", False):
        raise TraceError(f"job {job.name!r}: enable_qat and enable_auto_mixed_precision do not "
                         "combine: OneFlow quantizes float32 blobs only, and mixed precision "
                         "makes them half", location=where)
    default = config.get("default_data_type")
    if default is not None and dtypes.to_numpy(default) != np.float32:
        raise TraceError(f"job {job.name!r}: quantization-aware training needs the default "
                         "data type float32 (OneFlow: Check failed: DefaultDataType() == "
                         "kFloat)", location=where)
    if settings.per_channel and settings.formula == "cambricon":
        raise TraceError(f"job {job.name!r}: qat.per_channel_weight_quantization(True) does "
                         "not combine with target_backend 'cambricon' (OneFlow's "
                         "min_max_observer has no per-channel cambricon formula)", location=where)
    builder.qat = QatTracer(builder, settings, job.is_train)


def active():
    """The QatTracer of the job being traced in this thread, or None."""
    return current_builder().qat if in_job() else None


def int8_op(op_type, fn, *inputs):
    """fn(*inputs), the int8 op `op_type`, under the QAT rules when they apply."""
    tracer = active()
    site = tracer.int8(op_type, inputs) if tracer is not None else None
    if site is None:
        return fn(*inputs)
    return tracer.done(site, fn(*site.inputs))


def chain(op_type, x, bias=None):
    """The site of conv-chain op `op_type` reading `x` (see QatTracer.chain), or None."""
    tracer = active()
    return tracer.chain(op_type, x, bias) if tracer is not None else None


def transparent(x):
    """The site of a reshape of `x` (see QatTracer.transparent), or None."""
    tracer = active()
    return tracer.transparent(x) if tracer is not None else None


def done(site, out):
    """`out`, recorded as the output of `site` (nothing to do for None)."""
    return out if site is None else site.tracer.done(site, out)
