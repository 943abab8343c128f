"""tinynn: a small, readable neural-network framework.

    import tinynn
    x = tinynn.tensor([[1.0, 2.0]], requires_grad=True)

Tensors compute through a backend (backends.py): NumPy by default, a GPU when tinynn-gpu is installed.
"""
from tinynn.errors import TinynnError
from tinynn.precision import set_matmul_precision
from tinynn.rng import manual_seed
from tinynn.tensor import Tensor, no_grad, ones, tensor, zeros

__version__ = "0.1.0"
__all__ = ["Tensor", "TinynnError", "manual_seed", "no_grad", "ones", "set_matmul_precision", "tensor", "zeros",
           "__version__"]
