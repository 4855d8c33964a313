"""Checks of the arguments of tailcut's Python API, one message shape for all.

    count("num_workers", True, minimum=1)
    -> TypeError: num_workers must be an int >= 1, got True (bool)

A wrong type raises TypeError, a value out of range tailcut.InvalidArgumentError
(a ValueError); both name the argument, the rule and the value with its type.
A bool is not a count, a str is not a number, a float is not a count; an int
subclass other than bool and anything with __index__ (numpy integers) is.
The C++ bindings (bindings/conversions.cc) word their checks the same way.
"""

import math
import operator

from tailcut._core import InvalidArgumentError


def _got(value):
    return f"got {value!r} ({type(value).__name__})"


def _is_bool(value):
    # numpy.bool_ has no __index__, but say "bool" for it too.
    return isinstance(value, bool) or type(value).__name__ == "bool_"


def count(name, value, minimum=0, maximum=None, allow_none=False):
    """`value` as an int in [minimum, maximum]; None passes when allow_none."""
    if value is None and allow_none:
        return None
    rule = f"an int >= {minimum}" if maximum is None else f"an int in [{minimum}, {maximum}]"
    if allow_none:
        rule += " or None"
    if _is_bool(value) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be {rule}, {_got(value)}")
    n = operator.index(value)
    if n < minimum or (maximum is not None and n > maximum):
        raise InvalidArgumentError(f"{name} must be {rule}, {_got(value)}")
    return n


def seconds(name, value, minimum=0.0, allow_zero=True, allow_none=False):
    """`value` as a finite float of seconds >= minimum (> minimum unless
    allow_zero); None passes when allow_none."""
    if value is None and allow_none:
        return None
    rule = f"a number of seconds {'>=' if allow_zero else '>'} {minimum:g}"
    if allow_none:
        rule += " or None"
    if _is_bool(value) or isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be {rule}, {_got(value)}")
    try:
        s = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be {rule}, {_got(value)}") from None
    if not math.isfinite(s) or s < minimum or (s == minimum and not allow_zero):
        raise InvalidArgumentError(f"{name} must be {rule}, {_got(value)}")
    return s


def flag(name, value):
    """`value` as a bool: True, False (or numpy's bools)."""
    if not _is_bool(value):
        raise TypeError(f"{name} must be True or False, {_got(value)}")
    return bool(value)


def choice(name, value, choices):
    """`value`, one of `choices` (strs)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {', '.join(map(repr, choices))}, {_got(value)}")
    if value not in choices:
        raise InvalidArgumentError(
            f"{name} must be one of {', '.join(map(repr, choices))}, {_got(value)}")
    return value


def text(name, value, allow_none=False):
    """`value`, a str without NUL or other control characters."""
    if value is None and allow_none:
        return None
    rule = "a str" + (" or None" if allow_none else "")
    if not isinstance(value, str):
        raise TypeError(f"{name} must be {rule}, {_got(value)}")
    bad = next((c for c in value if ord(c) < 0x20 or ord(c) == 0x7f), None)
    if bad is not None:
        raise InvalidArgumentError(
            f"{name} {value!r} contains the control character {bad!r}; remove it")
    return value


def callable_or_none(name, value):
    """`value`, a callable or None."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, {_got(value)}")
    return value
