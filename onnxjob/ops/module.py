"""`flow.nn.Module` of OneFlow <= 0.3 (oneflow/python/framework/module.py): a lazy-mode
helper that names a reusable piece of a job and counts its calls. (OneFlow 0.4 and 0.5
reuse the name for eager modules with Tensor parameters, which onnxjob does not run.)"""
import itertools

_ids = itertools.count()


class Module:
    """Subclass and override `forward(*args)`; call the module (not `forward`) inside a
    job. `module_name` is `name` or a unique "Module_<n>"; `call_seq_no` counts calls."""

    def __init__(self, name=None):
        self.module_name_ = name if name is not None else f"Module_{next(_ids)}"
        self.call_seq_no_ = 0

    @property
    def module_name(self):
        return self.module_name_

    @property
    def call_seq_no(self):
        return self.call_seq_no_

    def forward(self, *args):
        """The computation; subclasses override it."""
        raise NotImplementedError()

    def __call__(self, *args):
        ret = self.forward(*args)
        self.call_seq_no_ = self.call_seq_no_ + 1
        return ret

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # OneFlow asserts this when a module is deleted; here at class creation
        assert cls.__call__ is Module.__call__, "do not override __call__"
