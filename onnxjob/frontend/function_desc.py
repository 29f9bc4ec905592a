"""Reading a FunctionConfig back: `config.function_desc.<flag>` (OneFlow's FunctionDesc).

In OneFlow `config.<flag>` is always the setter; the values are read through
`config.function_desc`: `function_desc.<flag>` is the value set, else the flag's default
(from oneflow/core/job/job_conf.proto), `HasAttr(flag)` whether it was set, and
`IsTrainable()` whether the job is a train job.
"""

# job_conf.proto defaults of the flags that have one
FLAG_DEFAULTS = {
    "enable_cudnn": True, "cudnn_buf_limit_mbyte": 1024,
    "cudnn_conv_heuristic_search_algo": True, "cudnn_conv_use_deterministic_algo_only": False,
    "enable_fuse_add_to_output": False, "enable_fuse_cast_scale": False,
    "enable_fuse_model_update_ops": False, "enable_gradients_stats_aggregation": True,
    "optimizer_placement_optimization_threshold": 1024, "enable_inplace": True,
    "enable_inplace_in_reduce_struct": True, "prune_parallel_cast_ops": True,
    "prune_cast_to_static_shape_ops": True, "enable_auto_mixed_precision": False,
    "concurrency_width": 128, "use_xla_jit": False, "use_tensorrt": False,
    "allow_cpu_return_op": True, "enable_qat": False,
}


class FunctionDesc:
    """The flags of one FunctionConfig, read back."""

    def __init__(self, config, trainable=None):
        self._config = config
        self._trainable = trainable   # known for a job being traced

    def IsTrainable(self):
        """True for a train job (type "train" or the old config.train.* API)."""
        if self._trainable is not None:
            return self._trainable
        if self._config.job_type is not None:
            return self._config.job_type == "train"
        return bool(self._config.train_conf)

    def HasAttr(self, attr_name):
        """Whether the flag was set on this config."""
        return attr_name in self._config.flags

    def __getattr__(self, attr_name):
        if attr_name.startswith("_"):
            raise AttributeError(attr_name)
        flags = self._config.flags
        if attr_name in flags:
            return flags[attr_name]
        assert attr_name in FLAG_DEFAULTS, (
            f"function_desc.{attr_name}: the flag was not set and has no default")
        return FLAG_DEFAULTS[attr_name]
