"""An instance attribute that stands in front of a class's method for the length of a block.

`CudaGraphGenerator` routes a model's ``forward`` through its graphs, and records what
``generate()`` builds, by setting instance attributes for the length of one ``generate()``
call: the class is never touched (other instances, other threads' models are not affected), and
an attribute someone else had set on the instance is put back afterwards.

Example:
    ```python
    from kernels.generation.attributes import instance_attribute

    with instance_attribute(model, "forward", my_forward):
        model.generate(input_ids)  # calls my_forward
    ```
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def instance_attribute(obj: Any, name: str, value: Any) -> Iterator[None]:
    """Set ``obj.<name> = value`` for the block; afterwards delete it, or put back the instance
    attribute of that name that was there before."""
    own = vars(obj).get(name)  # an instance attribute someone set, if any
    setattr(obj, name, value)
    try:
        yield
    finally:
        if own is None:
            delattr(obj, name)
        else:
            setattr(obj, name, own)
