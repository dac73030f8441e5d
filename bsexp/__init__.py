"""bsexp: a laboratory for batch-size research in PyTorch."""

__version__ = "0.1.0"
