"""The training step's ops on the GPU besides the model's own: the gradient norm with its clip coefficient,
the optimizers' updates (multi_tensor.py's kernels over many parameters per dispatch), and data
parallelism's packing and host round trip (packing.py, host_reduce.py).

`StepOps` is a base of `WgpuBackend`; the NumPy references are in tinynn/numpy_backend.py under the same
names.
"""
from __future__ import annotations

from tinynn_gpu import host_reduce
from tinynn_gpu.pool import bindable
from tinynn_gpu.runtime import groups


class StepOps:
    def global_norm(self, arrays):
        return self._norm(arrays, None)[0]

    def global_norm_and_clip(self, arrays, max_norm):
        return self._norm(arrays, max_norm)

    def _norm(self, arrays, max_norm):
        """The norm and, given max_norm, the clip coefficient: the sums of squares, then one finish for both."""
        partials, count = self.multi.sum_squares([bindable(a) for a in arrays], lambda n: self._empty((n,)))
        norm = self._empty(())
        coefficient = self._empty(()) if max_norm is not None else self.rt.stand_in(1)
        self.rt.dispatch("norm", "norm_finish_main", 1, {0: partials, 2: norm, 4: coefficient},
                         {"count": count, "clip": int(max_norm is not None), "max_norm": max_norm or 0.0})
        return norm, (coefficient if max_norm is not None else None)

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
                             {0: bindable(p), 1: bindable(g), 2: bindable(buf), 5: bindable(hyper), 6: bindable(scale)},
                             {"n": p.size, "momentum": momentum, "weight_decay": weight_decay})

    def pack(self, arrays):
        flat = self._empty((sum(a.size for a in arrays),), arrays[0].dtype)
        self.packing.copy("pack", flat, [bindable(a) for a in arrays])
        return flat

    def unpack(self, flat, shapes):
        arrays = [self._empty(shape, flat.dtype) for shape in shapes]
        self.packing.copy("unpack", bindable(flat), arrays)
        return arrays

    def reduce_on_host_(self, src, dst, host, parts, in_thread=False):
        if not in_thread or src.buffer is None or dst.buffer is None:
            return super().reduce_on_host_(src, dst, host, parts)
        host_reduce.reduce_on_host_(self.rt, src, dst, host, parts)
