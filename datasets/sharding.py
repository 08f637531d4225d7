"""Which sample indices each rank trains on in a given epoch."""

import numpy as np
import torch


def shard_indices(n: int, rank: int, world_size: int, epoch: int, seed: int, shuffle: bool = True) -> torch.Tensor:
    """Rank `rank`'s indices for one epoch, like DistributedSampler with drop_last.

    All ranks draw the same per-epoch permutation and take interleaved positions
    (rank, rank + world_size, ...), so the k-th batches of all ranks together are
    exactly the k-th batch of a single process using world_size times the batch
    size: results do not depend on how the work is split.
    """
    if world_size < 1:
        raise ValueError(f"world_size={world_size} is invalid; use world_size >= 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is out of range; use 0 <= rank < world_size={world_size}")
    if n < world_size:
        raise ValueError(f"n={n} samples cannot be shared by world_size={world_size} ranks; use n >= world_size")
    if shuffle:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch_seed(seed, epoch)))
    else:
        order = torch.arange(n)
    usable = n - n % world_size  # equal shards keep collective ops in lockstep
    return order[rank:usable:world_size]


def epoch_seed(seed: int, epoch: int) -> int:
    """Mix (seed, epoch) into one seed; SeedSequence avoids the collisions of seed + epoch."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, np.uint64)[0])
