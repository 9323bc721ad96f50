"""TFRecord framing without TensorFlow (importing it costs seconds, more than the writing of small
datasets): each record is its length (uint64 LE), the masked CRC-32C of those 8 bytes (uint32 LE),
the data, and the masked CRC-32C of the data. The CRC of a large record is computed in numpy:
CHUNKS pieces at once (the register is linear over GF(2), and leading zero bytes leave a zero
register unchanged), then the pieces' registers combined pairwise with the matrix of "shift by n
zero bytes", and the initial value's contribution added the same way.
"""
from __future__ import annotations

import struct
from typing import BinaryIO

import numpy as np

CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected
MASK_DELTA = 0xA282EAD8
CHUNKS = 1024


def _byte_table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ CRC32C_POLY if c & 1 else c >> 1
        table[i] = c
    return table


TABLE = _byte_table()
BIT_POSITIONS = np.arange(32, dtype=np.uint32)


def _zero_byte_matrix() -> np.ndarray:
    """The GF(2) matrix [32, 32] of one zero byte through the register (column j: image of bit j)."""
    matrix = np.zeros((32, 32), dtype=np.int64)
    for j in range(32):
        image = int(TABLE[(1 << j) & 0xFF]) ^ ((1 << j) >> 8)
        matrix[:, j] = (image >> BIT_POSITIONS) & 1
    return matrix


ZERO_BYTE = _zero_byte_matrix()


def _power(matrix: np.ndarray, n: int) -> np.ndarray:
    """`matrix` to the power `n` over GF(2) (float32 products: exact, faster than integer ones)."""
    result, base = np.eye(32, dtype=np.float32), matrix.astype(np.float32)
    while n:
        if n & 1:
            result = (result @ base) % 2
        base = (base @ base) % 2
        n >>= 1
    return result


def _apply(matrix: np.ndarray, registers: np.ndarray) -> np.ndarray:
    """`matrix` applied to each register: in float32, whose BLAS product is exact for these sums of at
    most 32 ones, and several times faster than numpy's integer product (the reader checks every record)."""
    bits = ((registers[:, None] >> BIT_POSITIONS[None, :]) & 1).astype(np.float32)
    out = ((bits @ matrix.T.astype(np.float32, copy=False)) % 2).astype(np.uint32) << BIT_POSITIONS[None, :]
    return np.bitwise_or.reduce(out, axis=1)


def crc32c(data: bytes) -> int:
    """The CRC-32C of `data`."""
    n = len(data)
    if n < 4 * CHUNKS:
        register = 0xFFFFFFFF
        for byte in data:
            register = int(TABLE[(register ^ byte) & 0xFF]) ^ (register >> 8)
        return register ^ 0xFFFFFFFF
    length = -(-n // CHUNKS)
    padded = np.zeros(CHUNKS * length, dtype=np.uint8)
    padded[CHUNKS * length - n:] = np.frombuffer(data, dtype=np.uint8)
    block = padded.reshape(CHUNKS, length)
    registers = np.zeros(CHUNKS, dtype=np.uint32)
    for j in range(length):
        registers = TABLE[(registers ^ block[:, j]) & 0xFF] ^ (registers >> np.uint32(8))
    shift = _power(ZERO_BYTE, length)
    while len(registers) > 1:
        registers = _apply(shift, registers[0::2]) ^ registers[1::2]
        shift = (shift @ shift) % 2
    initial = _apply(_power(ZERO_BYTE, n), np.array([0xFFFFFFFF], dtype=np.uint32))[0]
    return int(registers[0] ^ initial) ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: rotated right by 15 bits plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def write_record(handle: BinaryIO, data: bytes) -> None:
    """Append one TFRecord holding `data`."""
    header = struct.pack("<Q", len(data))
    handle.write(header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data)))
