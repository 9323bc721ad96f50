"""Embedding tables as 8-bit rows for serving (`python -m deployment.export --int8_tables`).

Each row is quantized on its own, TorchRec's quantized-inference scheme: with its minimum as the bias
and (max - min) / 255 as the scale, a value v becomes round((v - bias) / scale), an unsigned byte, and
is read back as byte * scale + bias (at most scale / 2 away). A constant row has scale 1 and comes back
exactly. Scale and bias are kept in float32, one pair per row: a row of `dim` values costs dim + 8
bytes instead of 4 * dim, so tables narrower than MIN_DIM stay float32 (Wide & Deep's 1-wide tables).
numpy only: the serving side may import it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LEVELS = 255  # uint8: 0 .. 255
MIN_DIM = 3  # below it, the per-row scale and bias cost more than the float32 row


@dataclass(frozen=True)
class QuantizedTable:
    """A table's rows as bytes with their per-row float32 scale and bias, each `[rows, 1]`."""
    values: np.ndarray  # uint8 [rows, dim]
    scale: np.ndarray  # float32 [rows, 1]
    bias: np.ndarray  # float32 [rows, 1]

    @property
    def nbytes(self) -> int:
        """What the table costs in the model: the bytes, the scales and the biases."""
        return self.values.nbytes + self.scale.nbytes + self.bias.nbytes

    def dequantized(self) -> np.ndarray:
        """The float32 rows the serving graph computes from these bytes (`byte * scale + bias`)."""
        return self.values.astype(np.float32) * self.scale + self.bias


def worth_quantizing(dim: int) -> bool:
    """Whether a table of `dim`-wide rows is smaller as 8-bit rows with their scale and bias."""
    return dim >= MIN_DIM


def quantize_rows(table: np.ndarray, chunk_rows: int = 1 << 16) -> QuantizedTable:
    """Per-row min/max 8-bit quantization of a `[rows, dim]` float table (read in row chunks, so a
    memory-mapped table is never held whole as float64)."""
    if table.ndim != 2:
        raise ValueError(f"a table is [rows, dim], got shape {table.shape}")
    rows, dim = table.shape
    values = np.empty((rows, dim), np.uint8)
    scale = np.empty((rows, 1), np.float32)
    bias = np.empty((rows, 1), np.float32)
    for start in range(0, rows, chunk_rows):
        chunk = np.asarray(table[start:start + chunk_rows], np.float32)
        low = chunk.min(axis=1, keepdims=True)
        step = (chunk.max(axis=1, keepdims=True) - low) / np.float32(LEVELS)
        step = np.where(step > 0, step, np.float32(1.0)).astype(np.float32)
        codes = np.rint((chunk - low) / step)
        values[start:start + chunk_rows] = np.clip(codes, 0, LEVELS).astype(np.uint8)
        scale[start:start + chunk_rows], bias[start:start + chunk_rows] = step, low
    return QuantizedTable(values, scale, bias)
