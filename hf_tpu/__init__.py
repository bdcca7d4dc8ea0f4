"""hf-tpu: PyTorch's `tpu` device (torch_tpu where TPU chips are attached, a JAX/XLA stand-in elsewhere)."""
