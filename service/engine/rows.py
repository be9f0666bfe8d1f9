"""Which cross-attention rows a request asked for, and how they travel.

A token's attention is [n_text_layer, n_text_head, 1500] float32 softmax weights. A request
selects heads (none, the mean over the checkpoint's alignment heads, all, or a list) and a
data type; a row on the wire is [n_selected_heads or 1, 1500] little-endian, row-major.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xattn.model.decode.decoding import OptionsError
from xattn.model.net.dims import ModelDims
from xattn.v1 import transcriber_pb2 as pb

WIRE_DTYPES = {pb.DATA_TYPE_FLOAT16: np.dtype("<f2"), pb.DATA_TYPE_FLOAT32: np.dtype("<f4")}


@dataclass(frozen=True)
class RowSpec:
    """A resolved AlignmentOptions: what to cut out of each token's attention."""

    mode: int  # pb.AlignmentMode, never UNSPECIFIED
    heads: tuple[tuple[int, int], ...]  # (layer, head): MEAN averages them, HEADS keeps them
    data_type: int  # pb.DATA_TYPE_FLOAT16 or pb.DATA_TYPE_FLOAT32

    @property
    def enabled(self) -> bool:
        return self.mode != pb.ALIGNMENT_MODE_NONE

    @property
    def n_rows(self) -> int:
        """The first dimension of a token's row: selected heads, or 1 for the mean."""
        return 1 if self.mode == pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS else len(self.heads)

    def select(self, attention: np.ndarray) -> np.ndarray:
        """[n_layer, n_head, n_frames] float32 -> [n_rows, n_frames] float32."""
        layers = [layer for layer, _ in self.heads]
        heads = [head for _, head in self.heads]
        picked = attention[layers, heads]  # [len(heads), n_frames]
        if self.mode == pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS:
            return picked.mean(axis=0, keepdims=True, dtype=np.float32)  # [1, n_frames]
        return np.asarray(picked, dtype=np.float32)

    def tensor(self, rows: np.ndarray) -> pb.Tensor:
        """Pack `rows` (any shape) as a little-endian, row-major Tensor of the asked type."""
        data = np.ascontiguousarray(rows, dtype=WIRE_DTYPES[self.data_type]).tobytes()
        return pb.Tensor(shape=rows.shape, data_type=self.data_type, data=data)


def row_spec(
    options: pb.AlignmentOptions,
    default_mode: int,
    dims: ModelDims,
    alignment_heads: Sequence[tuple[int, int]],
) -> RowSpec:
    """Resolve the request's alignment options; OptionsError names anything impossible."""
    mode = options.mode
    if mode == pb.ALIGNMENT_MODE_UNSPECIFIED:
        mode = pb.ALIGNMENT_MODE_HEADS if options.heads else default_mode
    if mode not in pb.AlignmentMode.values():
        raise OptionsError(f"unknown alignment mode {mode}")
    if options.heads and mode != pb.ALIGNMENT_MODE_HEADS:
        name = pb.AlignmentMode.Name(mode)
        raise OptionsError(f"alignment heads are only for ALIGNMENT_MODE_HEADS, not {name}")
    data_type = options.data_type or pb.DATA_TYPE_FLOAT16
    if data_type not in WIRE_DTYPES:
        raise OptionsError(f"unknown alignment data type {data_type}")
    n_layer, n_head = dims.n_text_layer, dims.n_text_head
    if mode == pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS:
        heads = tuple(alignment_heads)
        if not heads:
            raise OptionsError("this checkpoint has no alignment heads to average")
    elif mode == pb.ALIGNMENT_MODE_ALL_HEADS:
        heads = tuple((layer, head) for layer in range(n_layer) for head in range(n_head))
    elif mode == pb.ALIGNMENT_MODE_HEADS:
        heads = tuple((h.layer, h.head) for h in options.heads)
        if not heads:
            raise OptionsError("ALIGNMENT_MODE_HEADS needs at least one head")
        for layer, head in heads:
            if not (0 <= layer < n_layer and 0 <= head < n_head):
                raise OptionsError(
                    f"attention head (layer {layer}, head {head}) does not exist: the decoder "
                    f"has {n_layer} layers of {n_head} heads (0-based)"
                )
    else:
        heads = ()
    return RowSpec(mode=mode, heads=heads, data_type=data_type)


def unpack(tensor: pb.Tensor) -> np.ndarray:
    """A Tensor back to a float32 array of its shape (for clients and tests)."""
    values = np.frombuffer(tensor.data, dtype=WIRE_DTYPES[tensor.data_type])
    return values.reshape(tuple(tensor.shape)).astype(np.float32)
