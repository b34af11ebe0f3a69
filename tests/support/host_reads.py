"""Which aten ops a piece of code runs, to show it reads no tensor on the host: on a GPU each
such read (``.item()``, ``bool(tensor)``, a shape that depends on values) waits for the device,
and a CUDA graph cannot capture it."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

#: The ops through which a tensor's values reach the host.
HOST_READS = frozenset(
    {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.item.default"}
)


class OpNames(TorchDispatchMode):
    """Records the name of every aten op dispatched inside it (``names``); the ops that custom
    ops run inside themselves are not seen."""

    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(str(func))
        return func(*args, **(kwargs or {}))

    @property
    def host_reads(self) -> set[str]:
        return self.names & HOST_READS
