"""The storages' reads: ``index_select`` gathers assembled into TensorDicts without re-checks.

:func:`gather_rows` serves 1-D storages, :func:`gather_coordinates` multi-dimensional
ones; :func:`select_rows` is the per-leaf gather both use, and :func:`assemble` the
unchecked TensorDict construction.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import expand_as_right

from torchrl_ext import _compat
from torchrl_ext.storages._numpy_rows import TORCH_DTYPES
from torchrl_ext.storages import _output_memory

__all__ = ["NO_ITEM_SHAPES", "assemble", "item_batch_shapes", "set_info", "gather_coordinates", "gather_rows", "select_rows", "take"]

def check_info_leads(key: Any, value: torch.Tensor, batch_size: torch.Size) -> None:
    """Refuses sampler info whose shape does not start with ``batch_size``."""
    if value.shape[: len(batch_size)] != batch_size:
        raise ValueError(
            f"sampler info {key!r} has shape {list(value.shape)}, which does not lead with the "
            f"sample's batch size {list(batch_size)}; return per-item info from the sampler."
        )


#: Item batch shapes of a stored TensorDict (:func:`item_batch_shapes`): the root's, and
#: ``(key, shape)`` of each sub-TensorDict with more batch dims than the root, deepest first.
ItemShapes = tuple[torch.Size, tuple[tuple[Any, torch.Size], ...]]
NO_ITEM_SHAPES: ItemShapes = (torch.Size(), ())


def item_batch_shapes(stored: TensorDictBase, batch_dims: int) -> ItemShapes:
    """The batch shape one stored item keeps beyond the ``batch_dims`` index dims: a ``[N, 2]``
    TensorDict stored with one index dim has items of batch shape ``[2]``, and a sub-TensorDict
    ``"agents"`` of batch shape ``[N, 3]`` under a ``[N]`` root has items of shape ``[3]``.
    Reads keep them, as TensorDict's own indexing does (multi-agent keys rely on it).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"agents": TensorDict({"o": torch.zeros(5, 3, 2)}, [5, 3])}, [5])
        >>> item_batch_shapes(td, 1)
        (torch.Size([]), ((('agents',), torch.Size([3])),))
    """
    root = stored.batch_size[batch_dims:]
    subs = []
    for key, value in stored.items(include_nested=True):
        if isinstance(value, TensorDictBase) and value.batch_dims > stored.batch_dims:
            key = key if isinstance(key, tuple) else (key,)
            subs.append((key, value.batch_size[batch_dims:]))
    subs.sort(key=lambda entry: -len(entry[0]))  # children before parents
    return (root, tuple(subs)) if root or subs else NO_ITEM_SHAPES


def assemble(entries: dict[Any, torch.Tensor], batch_size: torch.Size, device: Any,
             extra: dict[Any, torch.Tensor] | None = None, item_shapes: ItemShapes = NO_ITEM_SHAPES) -> TensorDict:
    """``TensorDict({**entries, **extra}, batch_size, device)`` without re-checking ``entries``.

    ``entries`` must already lead with ``batch_size`` and live on ``device`` (gathered from a
    storage's own leaves); ``extra`` (sampler info) is checked, moved to ``device`` and added.
    ``item_shapes`` (:func:`item_batch_shapes` of the stored data) restores the batch dims
    that stored items keep beyond ``batch_size``.

    Examples:
        >>> import torch
        >>> td = assemble({"a": torch.zeros(2, 3), ("b", "c"): torch.ones(2)}, torch.Size([2]), None,
        ...               extra={"index": torch.tensor([4, 1])})
        >>> td.batch_size, td["b", "c"].tolist(), td["index"].tolist()
        (torch.Size([2]), [1.0, 1.0], [4, 1])
    """
    batch_size = torch.Size(batch_size)
    if device is not None and not isinstance(device, torch.device):
        device = torch.device(device)
    for key, value in (extra or {}).items():
        check_info_leads(key, value, batch_size)
        entries[key] = value if device is None or value.device == device else value.to(device)
    # The entries satisfy TensorDict's batch-dim and device checks by construction.
    if item_shapes is NO_ITEM_SHAPES:
        return _compat.unchecked_tensordict(entries, batch_size, device)
    root, subs = item_shapes
    if root:  # sampler info leads with the sample's shape only: it is added after
        entries = {key: value for key, value in entries.items() if key not in (extra or {})}
    data = _compat.unchecked_tensordict(entries, batch_size + root, device)
    for key, shape in subs:
        data.get(key).batch_size = batch_size + shape
    if root:
        for key, value in (extra or {}).items():
            data.set(key, expand_as_right(value, data))  # as TorchRL's buffer sets "index"
    return data


def set_info(data: TensorDictBase, entries: dict[Any, torch.Tensor]) -> TensorDictBase:
    """Sets sampler info ``entries`` in a sample ``data`` (in place) as TorchRL's buffer does:
    an entry with fewer dims than the batch is broadcast over the rest (per-item info over
    ``[B, T]`` windows, ``"index"`` over items with batch dims of their own), and a locked
    sample (memory-mapped reads) is unlocked for the write and locked again."""
    locked = data.is_locked
    if locked:
        data.unlock_()
    for key, value in entries.items():
        data.set(key, expand_as_right(value, data) if value.ndim < data.batch_dims else value)
    if locked:
        data.lock_()
    return data


def gather_rows(
    stored: TensorDictBase,
    index: torch.Tensor,
    extra: dict[Any, torch.Tensor] | None = None,
    leaves: list[tuple[Any, torch.Tensor]] | None = None,
    pinned: bool = False,
    item_shapes: ItemShapes = NO_ITEM_SHAPES,
) -> TensorDict:
    """``stored[index]`` for a 1-D index, one ``index_select`` per leaf, plus ``extra`` entries.

    Args:
        stored: a TensorDict whose leaves are all tensors, batch dim first.
        index: 1-D integer tensor of rows, all within ``stored``.
        extra, leaves, pinned, item_shapes: see :func:`gather_coordinates`.

    Returns:
        A TensorDict of batch size ``[len(index), *item batch shape]`` on ``stored``'s device.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.storages._gathers import gather_rows
        >>> td = TensorDict({"a": torch.arange(5.0), ("b", "c"): torch.arange(5) * 10}, [5])
        >>> out = gather_rows(td, torch.tensor([4, 0]))
        >>> out["a"].tolist(), out["b", "c"].tolist()
        ([4.0, 0.0], [40, 0])
    """
    return gather_coordinates(stored, (index,), extra, leaves, pinned, item_shapes)


def select_rows(tensor: torch.Tensor, index: torch.Tensor, *, pinned: bool = False) -> torch.Tensor:
    """``tensor.index_select(0, index)``, into page-locked memory with ``pinned`` (CPU
    tensors). ``index`` must be within ``[0, len(tensor))``.

    Examples:
        >>> import torch
        >>> select_rows(torch.arange(6).reshape(3, 2), torch.tensor([2, 0])).tolist()
        [[4, 5], [0, 1]]
    """
    if not pinned or not tensor.is_cpu or tensor.requires_grad:  # out= gathers cannot record autograd
        return tensor.index_select(0, index)
    output = _output_memory.pinned_empty((index.numel(), *tensor.shape[1:]), tensor.dtype)
    return torch.index_select(tensor, 0, index, out=output)


def take(array: np.ndarray, rows: np.ndarray, *, pinned: bool = False) -> torch.Tensor:
    """``array[rows]`` (rows along the first dim) as a new tensor, through numpy's ``take``;
    with ``pinned`` (and a dtype torch shares with numpy), into page-locked memory.

    Raises:
        IndexError: a row outside ``[-len(array), len(array))``.
    """
    torch_dtype = TORCH_DTYPES.get(array.dtype) if pinned else None
    if torch_dtype is None:
        return torch.from_numpy(array.take(rows, axis=0))
    output = _output_memory.pinned_empty((rows.size, *array.shape[1:]), torch_dtype)
    high = array.shape[0]
    if rows.size and (rows.min() < -high or rows.max() >= high):
        raise IndexError(f"row index out of range for {high} rows (got rows in [{rows.min()}, {rows.max()}]).")
    # Checked above, so "wrap" only maps negative rows as "raise" would, and lets numpy gather
    # straight into the output ("raise" gathers into a buffer and copies it over).
    array.take(rows, axis=0, out=output.numpy(), mode="wrap")
    return output


def gather_coordinates(
    stored: TensorDictBase,
    index: tuple[torch.Tensor, ...],
    extra: dict[Any, torch.Tensor] | None = None,
    leaves: Any = None,
    pinned: bool = False,
    item_shapes: ItemShapes = NO_ITEM_SHAPES,
) -> TensorDict:
    """``stored[index]`` for one integer tensor per leading dim: one ``index_select``
    of flat rows per leaf (TensorDict's advanced indexing costs several times more).

    Args:
        stored: a TensorDict whose leaves are all tensors, ``len(index)`` leading dims
            laid out contiguously (so each leaf flattens to rows without a copy).
        index: coordinates, broadcastable to the result's batch shape.
        extra: entries of the result's batch shape added to it.
        leaves: ``stored``'s ``(key, tensor)`` leaves, if the caller keeps them
            (listing them costs microseconds per call).
        pinned: gather CPU leaves into page-locked host memory (needs an accelerator;
            ``extra`` entries are added as they are).
        item_shapes: :func:`item_batch_shapes` of ``stored`` when it has any.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_ext.storages._gathers import gather_coordinates
        >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3)}, [2, 3])
        >>> gather_coordinates(td, (torch.tensor([1, 0]), torch.tensor([2, 1])))["a"].tolist()
        [5.0, 1.0]
    """
    coords = torch.broadcast_tensors(*index) if len(index) > 1 else index
    ndim, shape = len(coords), coords[0].shape
    flat = coords[0]
    for coord, size in zip(coords[1:], stored.batch_size[1:]):
        flat = flat * size + coord
    device = stored.device
    flat = flat.reshape(-1) if device is None else flat.reshape(-1).to(device)
    if leaves is None:
        leaves = stored.items(include_nested=True, leaves_only=True)
    entries = {}
    for key, leaf in leaves:
        rows = select_rows(leaf.flatten(0, ndim - 1), flat, pinned=pinned)
        # A sampler's usual [B] index: the gathered rows already have the batch shape.
        entries[key] = rows if len(shape) == 1 else rows.reshape(*shape, *leaf.shape[ndim:])
    return assemble(entries, shape, device, extra, item_shapes)
