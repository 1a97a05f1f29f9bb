"""States rewritten the way a hostile file would be, for the red-team cases: cells that belong
to no sequence and recurrent sequences of several cells. They follow llama.cpp's layouts (see
``crates/llamactx-engine/src/open_context/state_layout.rs``) for the test models: KV cells without
extensions, each naming one sequence, and V rows in every KV layer, not transposed."""

from __future__ import annotations

import struct


def memory_at(state: bytes) -> int:
    """Where a whole state's memory starts: after the architecture name and its length."""
    name_length: int = struct.unpack_from("<I", state, 0)[0]
    return 4 + name_length


def kv_part_length(memory: bytes) -> int:
    """The bytes of a KV part: a stream count, then per stream a cell count and, unless it is
    0, the cells and the data (four header words, then each layer's K and V rows)."""
    (n_stream,) = struct.unpack_from("<I", memory, 0)
    at = 4
    for _ in range(n_stream):
        (cells,) = struct.unpack_from("<I", memory, at)
        at += 4
        if cells == 0:
            continue
        at += 12 * cells  # position, sequence count (1), sequence id
        (layers,) = struct.unpack_from("<I", memory, at + 4)
        at += 16
        for _ in range(2 * layers):
            _, row = struct.unpack_from("<iQ", memory, at)
            at += 12 + row * cells
    return at


def without_an_owner(state: bytes, cell_at: int) -> bytes:
    """``state`` with the cell at ``cell_at`` (position, sequence count 1, sequence id) made to
    belong to no sequence: its count set to 0 and its id dropped."""
    position, n_seq_id = struct.unpack_from("<iI", state, cell_at)
    assert n_seq_id == 1
    return state[:cell_at] + struct.pack("<iI", position, 0) + state[cell_at + 12 :]


def as_two_cells(state: bytes, at: int) -> bytes:
    """A sequence state whose recurrent part, at ``at``, holds its one cell twice: the cell's
    position and sequence count (0 in a sequence state), and each layer's row."""
    (position,) = struct.unpack_from("<i", state, at + 4)
    cells = struct.pack("<iIiI", position, 0, position, 0)
    layers = bytearray(state[at + 12 : at + 20])  # s_trans, n_layer
    row_at = at + 20
    while row_at < len(state):
        _, row = struct.unpack_from("<iQ", state, row_at)
        layers += state[row_at : row_at + 12] + state[row_at + 12 : row_at + 12 + row] * 2
        row_at += 12 + row
    return state[:at] + struct.pack("<I", 2) + cells + bytes(layers)
