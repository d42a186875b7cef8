"""Where each rank's slice of the vocabulary sits (`vocab_parallel.py`'s layout): the process
group, the slices' sizes and offsets (gathered, passed, or a DTensor's), and the DTensor
arguments turned into local tensors with the checks that keep every rank's call consistent."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class _Layout:
    """Where this rank's classes sit in the vocabulary."""

    group: object  # the ProcessGroup the collectives run on
    world: int
    index: int  # this rank's slice, in group rank order
    start: int  # its first class
    local: int  # V_r, its number of classes
    vocab: int  # V, all classes


def _dtensor_type():
    """torch's DTensor class, or None where this torch has none."""
    if not dist.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5
        try:
            from torch.distributed._tensor import DTensor
        except ImportError:
            return None
    return DTensor


def _is_dtensor(t) -> bool:
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def chunk_sizes(vocab: int, world: int) -> list[int]:
    """The slice sizes DTensor's Shard placement gives `vocab` classes over `world` ranks
    (torch.chunk's rule: ceil(V / world) each, the last ones smaller or empty)."""
    full = -(-vocab // world) if world else 0
    return [max(0, min(full, vocab - i * full)) for i in range(world)]


def _vocab_mesh_dim(op: str, name: str, dt, dim: int) -> int:
    """The one mesh dimension along which DTensor `dt` shards its tensor dimension `dim`."""
    d = dim % dt.ndim
    found = []
    for i, p in enumerate(dt.placements):
        if p.is_partial():
            raise ValueError(
                f"{op}: '{name}' has a Partial placement on mesh dimension {i}; reduce it "
                "first (redistribute to Shard or Replicate)"
            )
        if p.is_shard(d):
            found.append(i)
    if len(found) != 1:
        raise ValueError(
            f"{op}: a DTensor '{name}' must be sharded along its vocabulary dimension "
            f"({dim}, i.e. Shard({d})) on exactly one mesh dimension; got placements "
            f"{tuple(dt.placements)}"
        )
    return found[0]


def _replicated_local(op: str, name: str, t, mesh, mesh_dim: int | None):
    """A DTensor's local tensor, checking it is whole along the vocabulary's mesh dimension
    (every rank of the vocabulary group must see the same tokens); other tensors as they are."""
    if t is None or not _is_dtensor(t):
        return t
    if mesh_dim is not None:
        if t.device_mesh != mesh:
            raise ValueError(f"{op}: '{name}' is on another device mesh than the vocabulary")
        if not t.placements[mesh_dim].is_replicate():
            raise ValueError(
                f"{op}: '{name}' must be Replicate on mesh dimension {mesh_dim} (the one that "
                f"splits the vocabulary), got {t.placements[mesh_dim]}"
            )
    return t.to_local()


def _sharded_local(op: str, name: str, t, mesh, mesh_dim: int, dim: int):
    """The local slice of a DTensor sharded along the vocabulary like the main input."""
    if t is None or not _is_dtensor(t):
        return t
    if t.device_mesh != mesh or _vocab_mesh_dim(op, name, t, dim) != mesh_dim:
        raise ValueError(
            f"{op}: '{name}' must be sharded along the vocabulary on the same mesh dimension "
            "as the main input"
        )
    return t.to_local()


def _from_dtensor(op: str, name: str, dt, dim: int, group, shard_sizes):
    """(local tensor, group, mesh, mesh dim, layout) for a vocabulary-sharded DTensor."""
    if group is not None or shard_sizes is not None:
        raise ValueError(
            f"{op}: with a DTensor '{name}' the group and the slice sizes come from its "
            "device mesh; leave group and shard_sizes as None"
        )
    mesh = dt.device_mesh
    mdim = _vocab_mesh_dim(op, name, dt, dim)
    local = dt.to_local()
    world = mesh.size(mdim)
    index = mesh.get_local_rank(mdim)
    vocab = dt.shape[dim]
    sizes = chunk_sizes(vocab, world)
    if local.shape[dim] != sizes[index]:
        raise ValueError(
            f"{op}: '{name}' holds {local.shape[dim]} classes on mesh coordinate {index}; "
            f"expected {sizes[index]} (torch.chunk's split of {vocab} over {world})"
        )
    lay = _Layout(mesh.get_group(mdim), world, index, sum(sizes[:index]), sizes[index], vocab)
    return local, mesh, mdim, lay


def _resolve_group(op: str, group):
    if group is not None:
        return group
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            f"{op}: no process group: pass group=..., call torch.distributed."
            "init_process_group() first, or pass a DTensor sharded along the vocabulary"
        )
    return dist.group.WORLD


def _layout(op: str, group, local: int, target: torch.Tensor, shard_sizes) -> _Layout:
    """This rank's slice of the vocabulary in `group`.

    With `shard_sizes` (every rank's V_r, in group rank order) no communication. Without, one
    all_gather of (V_r, rows, a checksum of the targets) per call, which also turns ranks that
    disagree on the tokens into an error on every rank instead of a hang or a wrong loss.
    """
    group = _resolve_group(op, group)
    world = dist.get_world_size(group)
    index = dist.get_rank(group)
    if index < 0:
        raise RuntimeError(f"{op}: this process is not a member of the given group")
    if shard_sizes is not None:
        sizes = [int(s) for s in shard_sizes]
        if len(sizes) != world or min(sizes) < 0:
            raise ValueError(
                f"{op}: shard_sizes must give one size >= 0 per rank of the group "
                f"({world}), got {list(shard_sizes)}"
            )
        if sizes[index] != local:
            raise ValueError(
                f"{op}: shard_sizes[{index}] = {sizes[index]} but this rank holds {local} classes"
            )
    else:
        t = target.reshape(-1).long()
        pos = torch.arange(1, t.numel() + 1, device=t.device)
        mine = torch.stack([t.new_tensor(local), t.new_tensor(t.numel()), ((t + 101) * pos).sum()])
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine, group=group)
        rows = torch.stack(every).tolist()  # a host sync: the sizes set the offsets
        sizes = [r[0] for r in rows]
        if len({r[1] for r in rows}) != 1:
            raise ValueError(
                f"{op}: the ranks hold different numbers of tokens {[r[1] for r in rows]}; "
                "every rank of the vocabulary group must see the same tokens"
            )
        if len({r[2] for r in rows}) != 1:
            raise ValueError(
                f"{op}: the ranks hold different targets; every rank of the vocabulary group "
                "must see the same tokens and targets"
            )
    vocab = sum(sizes)
    if vocab == 0:
        raise ValueError(f"{op}: the vocabulary is empty on every rank")
    return _Layout(group, world, index, sum(sizes[:index]), local, vocab)
