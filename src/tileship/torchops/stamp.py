"""Kernel stamp: which release a model's kernels came from, saved with its weights and checked on load.

KernelStamp is the model.tileship_kernels submodule swap adds; save/load
and load_state_dict raise KernelMismatch when a checkpoint names other kernels.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tileship.errors import KernelMismatch

STAMP = "tileship_kernels"
FILE_FORMAT = "tileship.model/1"


# -- the stamp ------------------------------------------------------------------------
class KernelStamp(nn.Module):
    """Which kernels a model runs. No parameters or buffers; its extra state is saved in the
    model's state_dict and checked when one is loaded (``KernelMismatch`` on a difference,
    unless ``allow_mismatch``)."""

    def __init__(self, release_id: str, kernel_revision: str, operators: tuple[str, ...]) -> None:
        super().__init__()
        self.release_id = release_id
        self.kernel_revision = kernel_revision
        self.operators = operators
        self.allow_mismatch = False

    def to_json(self) -> dict[str, Any]:
        return {"release_id": self.release_id, "kernel_revision": self.kernel_revision,
                "operators": list(self.operators)}

    def get_extra_state(self) -> dict[str, Any]:
        return self.to_json()

    def set_extra_state(self, state: Any) -> None:
        check_stamp(self.to_json(), state, allow_mismatch=self.allow_mismatch)

    def _load_from_state_dict(self, state_dict: Mapping[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # Only the check: a checkpoint without a stamp (plain PyTorch weights) claims nothing
        # about kernels, so a missing key is not an error even under strict loading.
        key = prefix + "_extra_state"
        if key in state_dict:
            self.set_extra_state(state_dict[key])

    def extra_repr(self) -> str:
        return f"release_id={self.release_id}, kernel_revision={self.kernel_revision}"


def check_stamp(mine: Mapping[str, Any] | None, saved: Any, *, allow_mismatch: bool = False) -> None:
    """Raise KernelMismatch when ``saved`` (a checkpoint's stamp) names other kernels than
    ``mine`` (None: the model runs no tileship kernels). Returns None when they agree or
    ``allow_mismatch``."""
    if allow_mismatch or saved is None:
        return
    if not isinstance(saved, Mapping) or not {"release_id", "kernel_revision"} <= set(saved):
        raise KernelMismatch(f"the checkpoint's kernel stamp is malformed: {saved!r}", expected=mine, found=None,
                             hint="it should hold release_id and kernel_revision; re-save the checkpoint with "
                                  "tileship.torchops.swap.save")
    if mine is None:
        raise KernelMismatch(f"the checkpoint was saved from a model running release {saved['release_id']} "
                             f"(kernel revision {saved['kernel_revision']}); this model runs no tileship kernels",
                             expected=None, found=saved,
                             hint=f"swap(model, release {saved['release_id']}) before loading, or pass "
                                  "allow_kernel_mismatch=True to load the weights anyway")
    diffs = [f"{k} {saved[k]} (checkpoint) != {mine[k]} (model)" for k in ("release_id", "kernel_revision")
             if saved[k] != mine[k]]
    if diffs:
        raise KernelMismatch("the checkpoint names other kernels than the model runs: " + "; ".join(diffs),
                             expected=mine, found=saved,
                             hint="swap the model with the release the checkpoint names, or pass "
                                  "allow_kernel_mismatch=True")


def kernel_stamp(model: nn.Module) -> KernelStamp | None:
    """The model's stamp, or None when no release was swapped in (looks through torch.compile)."""
    stamp = getattr(_unwrap(model), STAMP, None)
    return stamp if isinstance(stamp, KernelStamp) else None


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule


# -- saving and loading -------------------------------------------------------------------
def load_state_dict(model: nn.Module, state_dict: Mapping[str, Any], *, allow_kernel_mismatch: bool = False,
                    strict: bool = True) -> Any:
    """``model.load_state_dict`` with the kernel check, also for a model with no kernels
    swapped in (a stamped checkpoint raises KernelMismatch there too, unless allowed)."""
    root = _unwrap(model)
    stamp = kernel_stamp(root)
    key = f"{STAMP}._extra_state"
    if stamp is None:
        check_stamp(None, state_dict.get(key), allow_mismatch=allow_kernel_mismatch)
        return root.load_state_dict({k: v for k, v in state_dict.items() if k != key}, strict=strict)
    before = stamp.allow_mismatch
    stamp.allow_mismatch = allow_kernel_mismatch
    try:
        return root.load_state_dict(state_dict, strict=strict)
    finally:
        stamp.allow_mismatch = before


def save(model: nn.Module, path: Path | str) -> None:
    """``torch.save`` of the state_dict under a header naming the kernels (None when the model
    runs none). Read back with ``load``. The file is replaced whole (``atomic_file.replacing``): killed at any
    instant, ``path`` holds the previous file or the new one, never part of one; a symlink is written through
    and the file's mode kept. Raises OSError when it cannot be written (the file is then as it was)."""
    from tileship.release.atomic_file import replacing

    stamp = kernel_stamp(model)
    with replacing(path) as (f, _):
        torch.save({"format": FILE_FORMAT, "kernels": stamp.to_json() if stamp else None,
                    "state_dict": _unwrap(model).state_dict()}, f)


def load(model: nn.Module, path: Path | str, *, allow_kernel_mismatch: bool = False,
         strict: bool = True) -> dict[str, Any] | None:
    """Load a file written by ``save`` into ``model`` (weights-only unpickling, onto the CPU,
    copied into the model's tensors wherever they live). Returns the file's kernel stamp.

    Raises KernelMismatch when the file names other kernels than the model runs (unless
    ``allow_kernel_mismatch``); ValueError when the file is not a tileship model file.
    """
    data = torch.load(str(path), map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
        raise ValueError(f"{path}: not a tileship model file (format "
                         f"{data.get('format') if isinstance(data, dict) else type(data).__name__!r}, "
                         f"expected {FILE_FORMAT!r}); for a bare state_dict use tileship.torchops.swap.load_state_dict")
    stamp = kernel_stamp(model)
    check_stamp(stamp.to_json() if stamp else None, data["kernels"], allow_mismatch=allow_kernel_mismatch)
    load_state_dict(model, data["state_dict"], allow_kernel_mismatch=True, strict=strict)  # checked above
    return data["kernels"]
