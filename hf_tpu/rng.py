"""Random numbers on `tpu`: a JAX PRNG key seeded by torch.manual_seed, split on every draw."""

from __future__ import annotations

import threading
from typing import Any

import torch

_state = threading.local()


def _key() -> Any:
    if not hasattr(_state, "key"):
        seed(torch.initial_seed())
    return _state.key


def seed(value: int) -> None:
    from hf_tpu import runtime

    _state.key = runtime.jax().random.PRNGKey(int(value) % (1 << 63))


class RngEnv:
    """The slice of torchax's Environment that its random lowerings use (`needs_env=True`)."""

    def get_and_rotate_prng_key(self, generator: torch.Generator | None = None) -> Any:
        from hf_tpu import runtime

        global _draws
        _draws += 1
        jax = runtime.jax()
        if generator is not None:
            if generator.device.type != "cpu":
                raise RuntimeError(
                    f"tpu random ops take a CPU generator (torch.Generator('cpu')), got one on {generator.device}"
                )
            # Draw the key from the CPU generator so that it advances, like any other draw from it.
            draw = torch.randint(0, 1 << 62, (1,), generator=generator).item()
            return jax.random.PRNGKey(draw)
        new, sub = jax.random.split(_key())
        _state.key = new
        return sub


ENV = RngEnv()
_draws = 0


def get_state() -> Any:
    """The key as it is (None before the first draw): a trace that drew from it puts it back (decomposed.py)."""
    return getattr(_state, "key", None)


def set_state(key: Any) -> None:
    if key is None:
        if hasattr(_state, "key"):
            del _state.key
    else:
        _state.key = key


def draws() -> int:
    """How many keys have been drawn so far (decomposed.py: did tracing a function draw random numbers?)."""
    return _draws
