"""Tensor: an array of some backend plus the links reverse-mode autograd needs.

A tensor made by an op remembers its inputs (`_parents`, a tuple) and a closure `_backward` that maps the
gradient of its output to the gradients of those inputs. `backward()` orders the graph with an explicit loop
(deep graphs would overflow Python's recursion limit), then walks it once from the output back. Only leaf
tensors that require grad keep `.grad`; intermediate gradients are dropped as soon as they are used.

    >>> x = tinynn.tensor([1.0, 2.0, 3.0], requires_grad=True)
    >>> (x * x).sum().backward(); x.grad.numpy()   # array([2., 4., 6.], dtype=float32)

Python's protocols behave as in PyTorch, or refuse: `a == b` and `a != b` are elementwise (1 where true, 0
elsewhere, in the operands' promoted dtype, so `(pred == y).mean()` is an accuracy), while a tensor hashes by
identity and `is` compares identity; `bool(t)` is the truth of a one-element tensor's value, and an error for
any other size; `len()` and iteration need at least one dimension; `np.asarray(t)` is `t.numpy()`, and a NumPy
ufunc called on a tensor is refused (it would leave the graph: use the tensor's own ops); `.T` reverses the
axes as NumPy's does; `repr` shows the values.
"""
from __future__ import annotations

import contextlib

import numpy as np

from tinynn import backends, registry

_grad_enabled = True
_UNIT_SEED = object()  # backward()'s gradient of one, for a backward that takes it as None (accepts_unit_seed)


@contextlib.contextmanager
def no_grad():
    """Run ops without recording the graph (evaluation, sampling, optimizer updates)."""
    global _grad_enabled
    previous, _grad_enabled = _grad_enabled, False
    try:
        yield
    finally:
        _grad_enabled = previous


def is_grad_enabled() -> bool:
    return _grad_enabled


class Tensor:
    __slots__ = ("data", "backend", "grad", "requires_grad", "_parents", "_backward", "__weakref__")
    # NumPy arrays and scalars on the left of an operator defer to Tensor's reflected one, and a ufunc applied
    # to a tensor is an error instead of a host array cut off from the graph
    __array_ufunc__ = None
    __hash__ = object.__hash__  # identity, as `==` is elementwise: tensors stay usable as dict keys

    def __init__(self, data, backend: backends.Backend, requires_grad=False, _parents=(), _backward=None):
        self.data = data
        self.backend = backend
        self.grad: Tensor | None = None
        self.requires_grad = requires_grad
        self._parents = _parents
        self._backward = _backward

    # --- what it is ---
    @property
    def shape(self) -> tuple:
        return self.data.shape  # a tuple in every backend (read ~3 times per op of an eager forward)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.data.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __bool__(self):
        if self.size != 1:
            raise RuntimeError(f"the truth value of a tensor of shape {self.shape} ({self.size} values) is "
                               "ambiguous: use .sum(), .max() or .item() to say which")
        return bool(self.item())

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __repr__(self):
        values = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({values}, shape={self.shape}, dtype={self.dtype}, backend={self.backend.name}{grad})"

    def __array__(self, dtype=None, copy=None):
        if copy is False:
            raise ValueError("a tensor's values reach NumPy as a copy (np.asarray(t) is t.numpy())")
        return self.numpy() if dtype is None else self.numpy().astype(dtype, copy=False)

    # --- to and from the host ---
    def numpy(self) -> np.ndarray:
        return self.backend.to_numpy(self.data)

    def item(self) -> float:
        if self.size != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has shape {self.shape}")
        return self.numpy().reshape(()).item()

    def detach(self) -> Tensor:
        return Tensor(self.data, self.backend)

    def to(self, backend: backends.Backend | str) -> Tensor:
        """This tensor's values on another backend (a copy; the graph is not carried)."""
        if isinstance(backend, str):
            backend = registry.select(backend)
        return Tensor(backend.from_numpy(self.numpy()), backend, requires_grad=self.requires_grad)

    # --- autograd ---
    def backward(self, grad: Tensor | None = None) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's `.grad`. Without `grad`, a scalar's gradient is one: made
        on the device, or not at all where this tensor's backward is marked `accepts_unit_seed` (it is then called
        with g None and returns its gradients unscaled: the fused classifier's, which its forward made)."""
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad")
        if grad is None:
            if self.size != 1:
                raise RuntimeError(f"backward() without a gradient needs a scalar, got shape {self.shape}")
            unit = getattr(self._backward, "accepts_unit_seed", False)
            grad_data = _UNIT_SEED if unit else self.backend.full(self.shape, 1.0, self.dtype)  # no upload
        else:
            grad_data = grad.data if isinstance(grad, Tensor) else self.backend.from_numpy(np.asarray(grad))
        pending = {id(self): grad_data}
        for node in reversed(self._topological_order()):
            g = pending.pop(id(node), None)
            if g is None:
                continue
            if node._backward is None:  # a leaf
                node.grad = Tensor(g, node.backend) if node.grad is None else Tensor(
                    node.backend.binary("add", node.grad.data, g), node.backend)
                continue
            grads = self._run_backward(node, None if g is _UNIT_SEED else g, pending)
            for parent, parent_grad in zip(node._parents, grads):
                if parent_grad is None or not parent.requires_grad:
                    continue
                key = id(parent)
                pending[key] = parent_grad if key not in pending else node.backend.binary(
                    "add", pending[key], parent_grad)

    @staticmethod
    def _run_backward(node, g, pending):
        """node's parents' gradients. A backward marked `adds_first_parent_grad` takes its first parent's
        gradient gathered so far, if any, and returns it added in (one kernel instead of two)."""
        if getattr(node._backward, "adds_first_parent_grad", False) and id(node._parents[0]) in pending:
            return node._backward(g, pending.pop(id(node._parents[0])))
        return node._backward(g)

    def _topological_order(self) -> list[Tensor]:
        order, seen, stack = [], set(), [(self, False)]
        while stack:
            node, children_done = stack.pop()
            if children_done:
                order.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((p, False) for p in node._parents if p.requires_grad and id(p) not in seen)
        return order

    # --- operators (the ops themselves live in functional.py) ---
    def __add__(self, other): return F.add(self, other)
    def __radd__(self, other): return F.add(self, other)
    def __sub__(self, other): return F.sub(self, other)
    def __rsub__(self, other): return F.add(F.neg(self), other)
    def __mul__(self, other): return F.mul(self, other)
    def __rmul__(self, other): return F.mul(self, other)
    def __truediv__(self, other): return F.div(self, other)
    def __rtruediv__(self, other): return F.mul(F.pow(self, -1.0), other)
    def __neg__(self): return F.neg(self)
    def __pow__(self, exponent): return F.pow(self, exponent)
    def __matmul__(self, other): return F.matmul(self, other)
    def __getitem__(self, index): return F.getitem(self, index)
    def __eq__(self, other): return self._equal(other, negate=False)
    def __ne__(self, other): return self._equal(other, negate=True)

    def _equal(self, other, negate: bool):
        """Elementwise ==, or != with `negate`: 1 or 0 in the operands' promoted dtype (NumPy's rules, a Python
        number taking the tensor's dtype where it can), never part of the graph."""
        be = self.backend
        if isinstance(other, Tensor):
            if other.backend is not be:
                raise ValueError(f"tensors on different backends: {be.name} and {other.backend.name}")
            other_data = other.data
        else:
            array = np.asarray(other)
            if array.dtype.kind not in "biuf":  # None, a string, ...: Python's answer (identity, so False)
                return NotImplemented
            dtype = np.result_type(self.dtype, other if array.ndim == 0 and not isinstance(other, np.ndarray)
                                   else array)
            other_data = be.from_numpy(np.asarray(array, dtype=dtype))
        equal = be.binary("eq", self.data, other_data)
        if negate:
            equal = be.binary("sub", be.full((), 1, np.dtype(equal.dtype)), equal)
        return Tensor(equal, be)

    def sum(self, axis=None, keepdims=False): return F.sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return F.mean(self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return F.max(self, axis, keepdims)
    def reshape(self, *shape): return F.reshape(self, shape[0] if len(shape) == 1 else shape)
    def permute(self, *axes): return F.permute(self, axes[0] if len(axes) == 1 else axes)
    def transpose(self, dim0=-2, dim1=-1): return F.transpose(self, dim0, dim1)
    def exp(self): return F.exp(self)
    def log(self): return F.log(self)
    def tanh(self): return F.tanh(self)
    def relu(self): return F.relu(self)
    def gelu(self): return F.gelu(self)
    def softmax(self, axis=-1): return F.softmax(self, axis)
    def log_softmax(self, axis=-1): return F.log_softmax(self, axis)

    @property
    def T(self):
        """The axes reversed, as NumPy's `.T` (a 1-d tensor is itself); `transpose()` swaps the last two."""
        return self if self.ndim < 2 else F.permute(self, tuple(reversed(range(self.ndim))))


def tensor(data, requires_grad=False, dtype=None, backend: backends.Backend | str | None = None) -> Tensor:
    """A leaf tensor from anything NumPy accepts; floats default to float32."""
    if isinstance(backend, str):
        backend = registry.select(backend)
    backend = backend or registry.default()
    array = np.asarray(data.numpy() if isinstance(data, Tensor) else data)
    if dtype is not None:
        array = array.astype(dtype)
    elif array.dtype.kind == "f" and array.dtype != np.float32 and not isinstance(data, np.ndarray):
        array = array.astype(np.float32)
    return Tensor(backend.from_numpy(array), backend, requires_grad=requires_grad)


def _shape(sizes) -> tuple:
    """`zeros(2, 3)` and `zeros((2, 3))` both mean shape (2, 3), as in PyTorch."""
    return tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else tuple(sizes)


def zeros(*shape, requires_grad=False, dtype=np.float32, backend=None) -> Tensor:
    return tensor(np.zeros(_shape(shape), dtype=dtype), requires_grad=requires_grad, backend=backend)


def ones(*shape, requires_grad=False, dtype=np.float32, backend=None) -> Tensor:
    return tensor(np.ones(_shape(shape), dtype=dtype), requires_grad=requires_grad, backend=backend)


from tinynn import functional as F  # noqa: E402  (functional builds on Tensor, defined above)
