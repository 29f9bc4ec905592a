"""Eager tensors (OneFlow 0.4/0.5's `flow.Tensor`, `flow.nn.Parameter`, `flow.autograd`,
`flow.experimental.optim`): values computed as their ops are called, on onnxruntime, with
the ops and gradient rules of the job compiler. tensor.py (the tensor and how an op runs
on tensors), tape.py (the recorded graph), node_runner.py (one node on arrays),
autograd.py (backward, grad, no_grad), optim.py and lr_scheduler.py (updates)."""
