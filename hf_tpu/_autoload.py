def autoload() -> None:
    """Called by `import torch` (the `torch.backends` entry point)."""
