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
            if generator.device.type == "tpu":
                return _generator_key(generator)
            if generator.device.type != "cpu":
                raise RuntimeError(
                    f"tpu random ops take a tpu or CPU generator, got one on {generator.device}"
                )
            # Draw the key from the CPU generator so that it advances, like any other draw from it.
            draw = torch.randint(0, 1 << 62, (1,), generator=generator).item()
            return jax.random.PRNGKey(draw)
        new, sub = jax.random.split(_key())
        _state.key = new
        return sub


ENV = RngEnv()
_draws = 0
# (generator, its offset before the draw) for draws from tpu generators, newest last: set_state rolls back
# the ones a failed trace made. Only the newest entries can matter, so the log is kept short.
_generator_log: list[tuple[torch.Generator, int]] = []
_LOG_MAX = 256


def _generator_key(generator: torch.Generator) -> Any:
    """The key of a draw from a torch.Generator('tpu'): its (seed, offset) pair folded into a JAX key, the
    offset then advanced by one (hf_tpu/native's generator keeps the pair), so reseeding or restoring a
    state repeats the draws, as with a CUDA generator's Philox (seed, offset)."""
    from hf_tpu import runtime

    seed, offset = generator.initial_seed(), generator.get_offset()
    generator.set_offset(offset + 1)
    _generator_log.append((generator, offset))
    if len(_generator_log) > _LOG_MAX:
        del _generator_log[: _LOG_MAX // 2]
    words = [seed >> 32, seed & 0xFFFFFFFF, offset >> 32, offset & 0xFFFFFFFF]
    return _fold_program()(runtime.jax().numpy.asarray(words, dtype="uint32"))


def _fold_program() -> Any:
    global _fold
    if _fold is None:
        from hf_tpu import runtime

        jax = runtime.jax()

        def fold(words: Any) -> Any:  # the key PRNGKey(seed) is, with both halves of the offset folded in
            return jax.random.fold_in(jax.random.fold_in(words[:2], words[2]), words[3])

        _fold = jax.jit(fold)
    return _fold


_fold: Any = None


def get_state() -> Any:
    """The key as it is (None before the first draw) and the draws from tpu generators so far: a trace that
    drew puts both back (decomposed.py)."""
    return getattr(_state, "key", None), len(_generator_log)


def set_state(state: Any) -> None:
    key, logged = state
    while len(_generator_log) > logged:
        generator, offset = _generator_log.pop()
        generator.set_offset(offset)
    if key is None:
        if hasattr(_state, "key"):
            del _state.key
    else:
        _state.key = key


def draws() -> int:
    """How many keys have been drawn so far (decomposed.py: did tracing a function draw random numbers?)."""
    return _draws
