"""Whether CUDA GPUs are here: the GPU tests skip without them."""


def has_gpus(n: int = 1) -> bool:
    """True if torch sees at least ``n`` CUDA GPUs. Only a torch that cannot be imported counts as
    none: a broken CUDA install raises, so that it fails the GPU tests instead of skipping them."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.cuda.device_count() >= n
