"""Page faults of the calling thread, for the benchmarks that print faults
per operation beside their times."""

import ctypes
import os
import resource
import struct


class FaultCounter:
    """Page faults the calling thread takes: trapped ones (perf), else all
    minor faults getrusage(RUSAGE_THREAD) counts."""

    _PERF_EVENT_OPEN = 298  # x86_64
    _SOFTWARE, _PAGE_FAULTS = 1, 2

    def __init__(self):
        self.fd = -1
        self.kind = "(rusage)"
        libc = ctypes.CDLL(None, use_errno=True)
        attr = ctypes.create_string_buffer(
            struct.pack("IIQ", self._SOFTWARE, 128, self._PAGE_FAULTS)
            + bytes(112), 128)
        if os.uname().machine == "x86_64":
            fd = libc.syscall(self._PERF_EVENT_OPEN, attr, 0, -1, -1, 0)
            if fd >= 0:
                self.fd, self.kind = fd, "trapped"

    def read(self):
        if self.fd >= 0:
            return struct.unpack("Q", os.read(self.fd, 8))[0]
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
