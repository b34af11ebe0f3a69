"""``kernels._rust``: the data types their Rust extension implements (metadata, variants,
digests, locks), mapped onto ours."""

import json

import kernels
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
