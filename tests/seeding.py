"""Fresh random inputs on every run, reproducible on demand.

One seed per test session: ``CUTE_KERNELS_SEED`` if set, else drawn from ``os.urandom`` (tests/conftest.py draws
it into the environment when unset, so pytest-xdist's workers share it). pytest prints it at the end of every run;
set ``CUTE_KERNELS_SEED`` to that value to replay a failure.
"""

import os
import random

import torch


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name) or str(default)
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected an integer") from None


RUN_SEED = _env_int("CUTE_KERNELS_SEED", int.from_bytes(os.urandom(4), "little"))
# how many cases each randomized test draws (tests/gpu/test_ranker_fuzz_gpu.py, the test_random_* tests)
FUZZ_CASES = _env_int("CUTE_KERNELS_FUZZ_CASES", 12)


def generator(offset: int = 0, device: str = "cuda") -> torch.Generator:
    """A generator for this run (CUDA by default; ``device="cpu"`` for CPU tests): the same ``offset``
    gives the same numbers within a run."""
    return torch.Generator(device=device).manual_seed(RUN_SEED + offset)


def case_rng(offset: int) -> random.Random:
    """A Python RNG for the randomized tests' case ``offset`` (their draws of shapes and options): the same
    ``offset`` gives the same case within a run."""
    return random.Random(RUN_SEED * 1000 + offset)
