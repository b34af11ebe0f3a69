"""``kernels._rust``: the data types their Rust extension implements (metadata, variants,
digests, locks), mapped onto ours."""

import enum
import json

import kernels
from kernels.repos.requirements import BACKEND_TYPES
from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)


class Metadata(kernels.Metadata):
    """A build variant's ``metadata.json``."""

    @classmethod
    def from_bytes(cls, data: bytes) -> "Metadata":
        try:
            parsed = json.loads(data)
        except ValueError as exc:
            raise ValueError(f"metadata.json is not JSON: {exc}") from exc
        return cls.from_dict(parsed)


class Backend(enum.Enum):
    """The backend types a build's metadata can name: our `BACKEND_TYPES`, under their
    member names."""

    CANN = "cann"
    CPU = "cpu"
    CUDA = "cuda"
    Metal = "metal"
    Neuron = "neuron"
    ROCm = "rocm"
    TPU = "tpu"
    XPU = "xpu"

    @staticmethod
    def from_str(s: str) -> "Backend":
        """The backend named `s`, in any case; a ValueError for one metadata cannot name."""
        try:
            return Backend(s.lower())
        except ValueError:
            raise ValueError(f"unknown backend {s!r} ({', '.join(BACKEND_TYPES)})") from None

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"Backend.{self.name}"


# The members are ours: a backend type added to the package must be named here too.
assert sorted(b.value for b in Backend) == sorted(BACKEND_TYPES), BACKEND_TYPES
