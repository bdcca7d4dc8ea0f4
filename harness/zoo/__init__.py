"""The model zoo: tiny random-weight models built offline from transformers' and diffusers' registries, and
real architectures from a models list resolved through the local Hugging Face cache.

    from harness.zoo import load_zoo, select, output_tensors
    for entry in select(load_zoo("smoke"), task="causal-lm"):
        built = entry.build(seed=0)
        out = output_tensors(built.run())
"""

from harness.zoo import builders, entry
from harness.zoo.entry import BuiltEntry, ZooBuildError, ZooEntry
from harness.zoo.outputs import output_tensors
from harness.zoo.zoo import load_zoo, select

entry.set_builder(builders.build_entry)  # ZooEntry.build (builders import the libraries only when building)

__all__ = ["BuiltEntry", "ZooBuildError", "ZooEntry", "load_zoo", "output_tensors", "select"]
