"""Fresh random inputs on every run, reproducible on demand.

One seed per test session: ``CUTE_KERNELS_SEED`` if set, else drawn from ``os.urandom`` (tests/conftest.py draws
it into the environment when unset, so pytest-xdist's workers share it). pytest prints it at the end of every run;
set ``CUTE_KERNELS_SEED`` to that value to replay a failure.
"""

import os

import torch

RUN_SEED = int(os.environ.get("CUTE_KERNELS_SEED") or int.from_bytes(os.urandom(4), "little"))


def generator(offset: int = 0, device: str = "cuda") -> torch.Generator:
    """A generator for this run (CUDA by default; ``device="cpu"`` for CPU tests): the same ``offset``
    gives the same numbers within a run."""
    return torch.Generator(device=device).manual_seed(RUN_SEED + offset)
