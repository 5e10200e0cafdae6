"""Hostile adapters whose ``CAPABILITIES`` the protocol cannot take, one object each (``minibert
check tests.examples.hostile_declarations:<name>``): every one used to run -- judged with the
defaults (``property_raises``: "2 op(s) conform", exit 0), or to end as an op red or a raw
TypeError -- and is now refused by every entry point before any check runs, in one line naming
the key, the value and what is accepted (exit 2)."""

from minibert_reference import ops


class _Linear:
    """The reference's linear and ReLU pairs, correct: only the declaration is wrong."""

    linear_forward = staticmethod(ops.linear_forward)
    linear_backward = staticmethod(ops.linear_backward)
    relu_forward = staticmethod(ops.relu_forward)
    relu_backward = staticmethod(ops.relu_backward)


class _PropertyRaises(_Linear):
    @property
    def CAPABILITIES(self):  # a declaration built from a field that was never set
        return self._capabilities


def _declaring(capabilities):
    return type("Declaring", (_Linear,), {"CAPABILITIES": capabilities})()


# reading it raises AttributeError: getattr(obj, "CAPABILITIES", None) took it for "absent"
property_raises = _PropertyRaises()
as_list = _declaring(["key_mask"])  # a raw TypeError
ranks_zero = _declaring({"ranks": {"linear": (0,)}})  # an op red on correct code
