"""The streaming pipeline: a worker's shard of a split, batched, through loader processes and pinned
memory onto the GPU on a side stream, resumable at any batch (``pipeline``).

What a dataset *is* (its files, decoding, splits, sharding) lives in the checkout's ``datasets/``
(``harness.checkout.datasets``); this package moves its samples. Never imports training or the
control plane.
"""
from .pipeline import ResidentBatches, StreamedBatches, default_data_workers, evaluation_batches, is_streamed

__all__ = ["ResidentBatches", "StreamedBatches", "default_data_workers", "evaluation_batches", "is_streamed"]
