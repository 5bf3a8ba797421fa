"""gpuverbs' exceptions: one hierarchy, the C++ library's words.

Every failure the library reports is a :class:`Error` (or a subclass) whose
message is exactly the text the C++ library gives for it (the verb that
failed, the object, what to do). Bad arguments (a wrong type, a negative
length, a tensor the library cannot take) are Python's own ``TypeError`` and
``ValueError``, naming the argument.
"""

from __future__ import annotations

import builtins
from typing import Any, List, Optional, Tuple

__all__ = [
    "Error",
    "RequestRefused",
    "CompletionError",
    "TimeoutError",
    "Aborted",
    "ConnectionRejected",
    "ConnectionClosed",
    "GpuDirectUnavailable",
]


class Error(Exception):
    """A gpuverbs failure.

    Attributes:
        message: the C++ library's words for it.
        code: a :class:`gpuverbs.Errc` member when ``category`` is
            ``"gpuverbs"``; otherwise the integer code (an errno value for
            ``"system"``/``"generic"``, an ``ibv_wc_status`` for
            ``"work completion"``, a CUresult for ``"cuda"``).
        category: the error category's name.
        verb: the call that failed ("ibv_reg_mr", "async_transfer", …).
        report: for a failed transfer, its :class:`gpuverbs.TransferReport`.
    """

    def __init__(self, message: str, code: Any = 0, category: str = "gpuverbs", verb: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.category = category
        self.verb = verb
        self.report: Optional[Any] = None

    def __str__(self) -> str:
        return self.message


class RequestRefused(Error):
    """A local check refused a request: nothing was posted (a range outside
    its region, too many scatter/gather entries, a misaligned atomic, …)."""


class CompletionError(Error):
    """The device failed a work request (its work-completion status is ``code``)."""


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 - the library's own timeout
    """A step did not finish in time (a bootstrap exchange, a connection, a wait)."""


class Aborted(Error):
    """The operation was taken back before it ran: cancelled while it waited
    for room, or its queue pair or completion queue was destroyed."""


class ConnectionRejected(Error):
    """The peer refused the rdma_cm connection."""


class ConnectionClosed(Error):
    """The peer closed the connection, or it is not (or no longer) established."""


class GpuDirectUnavailable(Error):
    """No registration method lets the NIC reach this GPU memory.

    ``rejections`` lists ``(method, reason)`` for every method tried.
    """

    rejections: List[Tuple[str, str]] = []
