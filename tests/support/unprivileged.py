"""Run a module or code without the power to ignore file permissions: ``python unprivileged.py -m MODULE ARGS``.

Tests run as root in CI, and root writes a ``chmod 0444`` file or a ``chmod 0555``
folder as if they were writable. Root owes that to three capabilities
(``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``, ``CAP_FOWNER``); this launcher
drops them from its own process (Linux ``capset``, no privilege needed to give
capabilities up) and then runs what it was given, which therefore meets file
permissions as any other owner does. For a user other than root it changes
nothing: permissions already apply. ``-c CODE`` runs code instead of a module.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import sys

_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_DROPPED = (1, 2, 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop_permission_override() -> None:
    """Give up the capabilities that let root ignore file permissions (raises OSError if not)."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    mask = 0xFFFFFFFF
    for capability in _DROPPED:
        mask &= ~(1 << capability)
    data[0].effective &= mask
    data[0].permitted &= mask
    data[0].inheritable &= mask
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def main() -> None:
    """Drop the capabilities, then run ``-m MODULE ARGS`` or ``-c CODE``."""
    drop_permission_override()
    flag, target, *rest = sys.argv[1:]
    if flag == "-c":
        sys.argv = ["-c", *rest]
        exec(compile(target, "<unprivileged>", "exec"), {"__name__": "__main__"})  # noqa: S102
    elif flag == "-m":
        sys.argv = [target, *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        raise SystemExit(f"usage: {sys.argv[0]} -m MODULE ARGS | -c CODE")


if __name__ == "__main__":
    main()
