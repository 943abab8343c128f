"""The optimizers' updates: AdamW over many parameters per dispatch (multi_tensor.py's generated kernel) and SGD
with momentum a parameter at a time (optimizer.wgsl). Methods of the backend (backend.py's table); the NumPy
references are in tinynn/numpy_backend.py under the same names."""
from __future__ import annotations

from tinynn_gpu.runtime.arrays import bindable
from tinynn_gpu.runtime.kernels import groups


def adamw_update_(self, params, grads, exp_avgs, exp_avg_sqs, hyper, *, beta1, beta2, eps, weight_decay,
                  grad_scale=None):
    scale = grad_scale if grad_scale is not None else self._constant(1.0)
    decays = list(weight_decay) if isinstance(weight_decay, (list, tuple)) else [weight_decay] * len(params)
    params, grads, exp_avgs, exp_avg_sqs = ([bindable(a) for a in arrays]
                                            for arrays in (params, grads, exp_avgs, exp_avg_sqs))
    self.multi.adamw(params, grads, exp_avgs, exp_avg_sqs, bindable(hyper), bindable(scale), beta1, beta2, eps,
                     decays)


def sgd_update_(self, params, grads, momentum_buffers, hyper, *, momentum, weight_decay, grad_scale=None):
    scale = grad_scale if grad_scale is not None else self._constant(1.0)
    for p, g, buf in zip(params, grads, momentum_buffers):
        self.rt.dispatch("optimizer", "sgd_main", groups(p.size),
                         {"param_": bindable(p), "grad": bindable(g), "buf1": bindable(buf), "step": bindable(hyper),
                          "scale": bindable(scale)},
                         {"n": p.size, "momentum": momentum, "weight_decay": weight_decay})
