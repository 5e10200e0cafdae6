"""The proxy's conversion layer: an implementation that computes on another array library than
NumPy -- torch tensors (autograd off, a hand-written backward) or any array-API namespace
(array-api-strict, CuPy, JAX) -- declares it once, ``CAPABILITIES = {"arrays": "torch"}``, and
every call the proxy makes hands it its inputs in that namespace and reads the results back to
NumPy.  Every check (finite differences, the oracle, the invariants, bad input) keeps comparing
NumPy arrays and needs no line of its own.

* **in**: each NumPy array of a call (inside tuples, lists and dicts too) becomes a copy in the
  namespace on its default device, of the same dtype (float32 stays float32; integer ids and
  labels, bool masks as they are); a NumPy float scalar becomes a 0-d array of its dtype (it
  promotes as NumPy's does, NEP 50); a NumPy dtype passed as an argument becomes the
  namespace's dtype of that name;
* **out**: each array of the namespace in the result becomes a NumPy array on the host (a copy:
  array-api-compat's ``to_device(x, "cpu")`` for device arrays, then DLPack), of the same dtype
  (a torch implementation that upcasts is red as a NumPy one is); a 0-d one becomes a NumPy
  scalar, as NumPy's own reductions return.  An array of another library (NumPy's, from
  ``np.exp`` of a strict array) is an error naming the function: the implementation left its
  namespace; a tensor that requires grad too (autograd is off);
* **the cache is opaque**: a forward's second result and a backward's second argument pass
  untouched both ways;
* **inputs are never mutated** (the protocol's contract), checked on the implementation's own
  arrays: what it is handed is a copy, so a change made in place would go unseen.  After every
  call, each handed array still alive (held by a cache, or handed in the last few calls) is
  compared with its value when handed, and a change is written back into the caller's NumPy
  array, where the checks of the contract see it exactly as they see a NumPy implementation's.

The namespace is the one array-api-compat gives for the declared library (``array_namespace``
of a 0-d array made by it): ``"torch"``, ``"cupy"``, ``"array_api_strict"``, ``"jax.numpy"``...
An implementation declaring NumPy (the default) goes through none of this: nothing is imported.
"""

from __future__ import annotations

import collections
import importlib
import weakref

import numpy as np

from minibert_spec.protocol.capabilities import DeclarationError

NUMPY = "numpy"
# the arrays handed in this many calls stay referenced here (beyond them, those an
# implementation keeps -- in a cache -- are followed by weak reference): a forward's inputs are
# still watched when its backward runs after another forward, even if the implementation's
# cache holds only a view of them
RECENT_CALLS = 4
INSTALL = "pip install 'minibert-spec[arrays]'"


def converter(name: str) -> Converter | None:
    """The conversion layer for a declared library (validated by
    minibert_spec.protocol.capabilities; None for NumPy: nothing to convert)."""
    return None if name == NUMPY else Converter(name)


def namespace(name: str):
    """array-api-compat's namespace of the library ``name`` (its own module when the library is
    already an array-API namespace).  A DeclarationError naming CAPABILITIES['arrays'] when the
    library or array-api-compat is not installed, or the library makes no array here (CuPy
    without a GPU): raised as the proxy is built, before any check runs."""
    where = f"CAPABILITIES['arrays'] = {name!r}"
    try:
        import array_api_compat
    except ImportError:
        raise DeclarationError(f"{where}: the conversion needs array-api-compat "
                               f"({INSTALL})") from None
    try:
        library = importlib.import_module(name)
    except ImportError as e:
        raise DeclarationError(f"{where}: cannot import it ({e})") from None
    try:
        return array_api_compat.array_namespace(library.asarray(0.0))
    except Exception as e:  # noqa: BLE001 -- any library's failure is the same one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise DeclarationError(f"{where}: it makes no array here ({type(e).__name__}: "
                               f"{first})") from None


def takes_cache(name: str) -> bool:
    """A backward: its second argument is the forward's cache."""
    return name.endswith("_backward") or name == "backward"


def returns_cache(name: str) -> bool:
    """A forward: its second result is the cache."""
    return name.endswith("_forward") or name == "forward"


class _Handed:
    """One array handed to the implementation: the caller's NumPy array and its value then."""

    def __init__(self, array, original: np.ndarray, label: str):
        try:
            self._ref, self._strong = weakref.ref(array), None
        except TypeError:  # a library whose arrays take no weak reference: the window only
            self._ref, self._strong = None, array
        self.original, self.snapshot, self.label = original, original.copy(), label

    def array(self):
        return self._ref() if self._ref is not None else self._strong


class Converter:
    """NumPy in, the implementation's namespace out, and back (see the module's docstring)."""

    def __init__(self, name: str):
        self.name = name
        self.xp = namespace(name)
        self._handed: list[_Handed] = []
        self._recent: collections.deque = collections.deque(maxlen=RECENT_CALLS)

    def __repr__(self) -> str:
        return f"<arrays {self.name}>"

    # ------------------------------------------------------------------ the call
    def call(self, name: str, fn, args: tuple, kwargs: dict):
        """``fn(*args, **kwargs)`` with NumPy converted to the namespace and back."""
        cache_in = takes_cache(name)
        handed: list = []
        args = tuple(a if cache_in and i == 1 else self.to_impl(a, handed, f"argument {i}")
                     for i, a in enumerate(args))
        kwargs = {k: v if cache_in and k == "cache" else self.to_impl(v, handed, k)
                  for k, v in kwargs.items()}
        self._recent.append([a for a, _ in handed])
        self._handed += [_Handed(a, original, label) for a, (original, label) in handed]
        try:
            result = fn(*args, **kwargs)
        finally:
            self.mirror(name)
        if returns_cache(name) and isinstance(result, tuple) and len(result) == 2:
            return self.to_numpy(result[0], name), result[1]
        return self.to_numpy(result, name)

    # ------------------------------------------------------------------ in
    def to_impl(self, value, handed: list, label: str):
        """``value`` with its NumPy arrays, scalars and dtypes in the namespace; ``handed``
        collects (namespace array, (NumPy original, label))."""
        if isinstance(value, np.ndarray):
            # a C-ordered copy of its own (torch takes no negative strides, which a flipped
            # view has), taken over by the namespace where it can (on the host), else copied
            array = self.xp.asarray(np.array(value, order="C", copy=True))
            handed.append((array, (value, label)))
            return array
        if isinstance(value, np.floating):
            return self.xp.asarray(value)
        if isinstance(value, np.generic):  # ints, bools: Python's (an index, a flag, a seed)
            return value.item()
        if isinstance(value, np.dtype) or (isinstance(value, type)
                                           and issubclass(value, np.generic)):
            return self.dtype(value)
        if type(value) is dict:
            return {k: self.to_impl(v, handed, f"{label}[{k!r}]") for k, v in value.items()}
        if type(value) in (list, tuple):
            return type(value)(self.to_impl(v, handed, f"{label}[{i}]")
                               for i, v in enumerate(value))
        return value

    def dtype(self, dtype):
        """The namespace's dtype of a NumPy dtype's name (float32 -> torch.float32)."""
        name = np.dtype(dtype).name
        try:
            return getattr(self.xp, name)
        except AttributeError:
            raise TypeError(f"the {self.name} namespace has no dtype {name}") from None

    # ------------------------------------------------------------------ out
    def to_numpy(self, value, where: str):
        """``value`` with the namespace's arrays as NumPy arrays on the host (0-d: scalars).
        An array of another library (a NumPy array from ``np.exp`` of a strict array) is a
        TypeError: the implementation left the namespace it declares."""
        if type(value) is dict:
            return {k: self.to_numpy(v, where) for k, v in value.items()}
        if type(value) in (list, tuple):
            return type(value)(self.to_numpy(v, where) for v in value)
        if not _is_array(value):
            return value
        import array_api_compat

        if array_api_compat.array_namespace(value) is not self.xp:
            raise TypeError(f"{where} returned a {type(value).__module__}."
                            f"{type(value).__name__}, not an array of {self.name} (it declares "
                            f"CAPABILITIES['arrays'] = {self.name!r}): a NumPy call on its arrays, "
                            "or a result of another library")
        out = self.host(value, f"{where} returned")
        return out[()] if out.ndim == 0 else out

    def host(self, array, where: str) -> np.ndarray:
        """A NumPy copy of one namespace array on the host."""
        if getattr(array, "requires_grad", False):
            raise TypeError(f"{where}: a {self.name} tensor that requires grad; the protocol's "
                            "tensors are computed with autograd off (a hand-written backward): "
                            "detach it, or build it without requires_grad")
        try:
            host = np.from_dlpack(array)
        except (BufferError, RuntimeError, TypeError, ValueError):  # on a device: copy it over
            import array_api_compat

            host = array_api_compat.to_device(array, "cpu")
            host = host if isinstance(host, np.ndarray) else np.from_dlpack(host)
        return np.array(host, copy=True)

    # ------------------------------------------------------------------ inputs untouched
    def mirror(self, where: str) -> None:
        """Write a change the implementation made in place to an array it was handed back into
        the caller's NumPy array (where the contract's checks see it); forget arrays that are
        gone."""
        recent = {id(a) for call in self._recent for a in call}
        kept = []
        for h in self._handed:
            array = h.array()
            if array is None:
                continue  # gone: nothing can change it any more
            now = self.host(array, f"{where} set its input {h.label}")
            if now.shape != h.snapshot.shape or now.tobytes() != h.snapshot.tobytes():
                h.snapshot = now
                _write_back(h, now, where)
            if h._ref is not None or id(array) in recent:
                kept.append(h)
        self._handed = kept


def _write_back(h: _Handed, now: np.ndarray, where: str) -> None:
    """``now`` into the caller's array (as much of it as fits a changed shape)."""
    if not h.original.flags.writeable:
        raise AssertionError(f"{where} modified its input {h.label} in place (the protocol's "
                             "inputs are never mutated)")
    if now.shape == h.original.shape:
        np.copyto(h.original, now, casting="unsafe")
    else:  # resized in place: the caller's array changes as far as the new values reach
        flat, new = h.original.reshape(-1), now.reshape(-1)
        k = min(flat.size, new.size)
        flat[:k] = new[:k]
        if k == 0 or np.array_equal(flat[:k], h.snapshot.reshape(-1)[:k]):
            raise AssertionError(f"{where} resized its input {h.label} in place (the "
                                 "protocol's inputs are never mutated)")


def _is_array(value) -> bool:
    """An array of any library, NumPy's included (array-api-compat's test)."""
    if isinstance(value, (bool, int, float, complex, str, bytes)) or value is None:
        return False
    import array_api_compat

    return array_api_compat.is_array_api_obj(value)
