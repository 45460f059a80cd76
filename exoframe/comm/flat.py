"""Move many tensors as one flat buffer, so a model's state crosses the network in one call."""
import torch


def flatten(tensors) -> torch.Tensor:
    """A new contiguous 1-D tensor holding every tensor's values (shares no storage)."""
    tensors = list(tensors)
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise ValueError(f"flatten needs tensors of one dtype, got {sorted(map(str, dtypes))}")
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def unflatten_into(flat: torch.Tensor, tensors):
    """Copy consecutive slices of `flat` back into `tensors`, in place."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n
    if offset != flat.numel():
        raise ValueError(f"flat buffer has {flat.numel()} elements, tensors hold {offset}")


def flatten_bytes(tensors) -> torch.Tensor:
    """Every tensor's raw bytes, one after another, as one uint8 tensor: tensors of mixed
    dtypes (a model's float statistics and integer counters) cross the network in one call."""
    return torch.cat([t.detach().reshape(-1).view(torch.uint8) for t in tensors])


def unflatten_bytes_into(flat: torch.Tensor, tensors):
    """Copy consecutive byte slices of `flat` back into `tensors`, in place."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel() * t.element_size()
            # clone: a slice at an odd offset cannot be viewed as a wider dtype
            t.copy_(flat[offset:offset + n].clone().view(t.dtype).view_as(t))
            offset += n
    if offset != flat.numel():
        raise ValueError(f"flat buffer has {flat.numel()} bytes, tensors hold {offset}")
