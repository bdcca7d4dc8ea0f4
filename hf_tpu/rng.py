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

    _state.seed = int(value)
    _state.key = runtime.jax().random.PRNGKey(int(value) % (1 << 63))


def initial_seed() -> int:
    """The seed the tpu key was last seeded with (torch's initial seed before any)."""
    return getattr(_state, "seed", torch.initial_seed())


def state_bytes() -> torch.Tensor:
    """The key as a uint8 CPU tensor (torch.tpu.get_rng_state): set_state_bytes of it repeats the draws."""
    import numpy as np

    return torch.from_numpy(np.asarray(_key()).astype(np.uint32).view(np.uint8).copy())


def set_state_bytes(state: torch.Tensor) -> None:
    import numpy as np

    from hf_tpu import runtime

    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() % 4:
        raise TypeError("set_rng_state takes the uint8 tensor torch.tpu.get_rng_state() returned, "
                        f"got {type(state).__name__} {getattr(state, 'dtype', '')} of {getattr(state, 'shape', '')}")
    words = state.detach().cpu().contiguous().numpy().view(np.uint32)
    expected = np.asarray(_key()).shape
    if words.shape != expected:
        raise ValueError(f"set_rng_state: a tpu state holds {4 * int(np.prod(expected))} bytes, got {state.numel()}")
    _state.key = runtime.jax().numpy.asarray(words)


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
