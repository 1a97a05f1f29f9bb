//! The memory part of states (KV streams, recurrent cells), walked before llama.cpp restores
//! them [llama.cpp internal]. One walk serves whole states and sequence states, whose memory
//! part has the same layout after their `io_magic` and sequence id.
//!
//! What it refuses:
//! - A cell that belongs to no sequence (whole states). llama.cpp restores it as it finds it.
//!   In a KV cache the cell is then masked from every sequence but holds its slot until the
//!   cache is cleared; in recurrent memory a new sequence that takes it starts from its state
//!   instead of from zeros. llama.cpp never writes such a cell.
//! - A KV cell at a position outside `0..=MAX_POSITION`. llama.cpp takes positions as they are,
//!   and a cell at 2**31 - 1 can then never be removed by any range (`seq_rm` covers positions
//!   below its end, and the largest end is 2**31 - 1), not even by the rollback of a failed
//!   restore.
//! - A recurrent sequence state of more than one cell (`check_recurrent_cells`).
//!
//! A hybrid model's states put the recurrent part after the KV part; the walk finds where it
//! starts.
//!
//! Layouts. Recurrent memory: a cell count, then each cell's position, sequence count and
//! sequence ids, then its data. A KV cache: a stream count, then per stream a cell count and,
//! unless it is 0, each cell's position, sequence count, optional 12-byte extension and sequence
//! ids, then the stream's data: `v_trans`, the layer count, two rotation sizes, each layer's K
//! rows (type, row size, rows) and the V rows of the layers that have them (type, row size,
//! rows; or, transposed, type, element size, width, elements). A layout this walk does not
//! recognise passes to llama.cpp, which checks what it can (and the restore checks positions
//! afterwards).

use crate::batch::MAX_POSITION;
use crate::errors::{Error, Result};

/// A cell's position and sequence count, before its extension and sequence ids.
pub const CELL_HEAD_BYTES: usize = 8;
/// llama.cpp's cell extension (M-RoPE positions), in the models that have one.
pub const EXTENSION_BYTES: usize = 12;
/// `v_trans`, the layer count and the two rotation sizes that start a stream's data.
pub const DATA_HEAD_BYTES: usize = 16;
/// A K or V layer's type and row size.
pub const ROWS_HEAD_BYTES: usize = 12;

/// The kind of memory a model's states hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    Kv,
    Recurrent,
    /// A KV part, then a recurrent part.
    Hybrid,
}

/// `StateError` for a whole state's memory (what follows the architecture name) holding a cell
/// that belongs to no sequence or a KV cell at a position out of range. `n_layer` is the
/// model's, to recognise the data sections.
pub fn check_owners(memory: &[u8], kind: Memory, n_layer: u32) -> Result<()> {
    let recurrent_at = match kind {
        Memory::Recurrent => Some(0),
        Memory::Kv => kv_part_end(memory, n_layer).map(|_| None)?,
        Memory::Hybrid => kv_part_end(memory, n_layer)?,
    };
    let recurrent_owned = recurrent_at
        .and_then(|at| cells_end(memory, at + 4, word(memory, at), 0))
        .is_none_or(|run| run.owned);
    if recurrent_owned {
        Ok(())
    } else {
        Err(ownerless())
    }
}

/// `StateError` for a recurrent part, at `at` of `state`, holding more than one cell. A
/// recurrent sequence is one cell (its state), and a sequence state llama.cpp writes holds 0 or
/// 1; it restores any other count into that one cell and then asserts that each position got a
/// cell of its own (`llama-memory-recurrent.cpp:1051`). The part starts with the cell count.
pub fn check_recurrent_cells(state: &[u8], at: usize) -> Result<()> {
    match word(state, at) {
        Some(cells) if cells > 1 => Err(Error::state(
            "Cells",
            format!("the sequence state holds {cells} cells; a recurrent model's sequence is one"),
        )),
        _ => Ok(()),
    }
}

pub fn ownerless() -> Error {
    Error::state(
        "Cells",
        "the state holds a cell that belongs to no sequence (llama.cpp never writes one)",
    )
}

pub fn out_of_range(position: i32) -> Error {
    Error::state(
        "Positions",
        format!("the state puts a cell at position {position}, outside 0..={MAX_POSITION}"),
    )
}

/// Where the KV part of `memory` ends (`None` for a layout the walk does not recognise);
/// `StateError` for a cell that belongs to no sequence or sits at a position out of range.
pub fn kv_part_end(memory: &[u8], n_layer: u32) -> Result<Option<usize>> {
    let Some(n_stream) = word(memory, 0) else {
        return Ok(None);
    };
    let mut at = 4;
    for stream in 0..n_stream {
        let cells = word(memory, at);
        if cells == Some(0) {
            // An empty stream is its cell count alone.
            at += 4;
            continue;
        }
        let Some(run) = [0, EXTENSION_BYTES]
            .into_iter()
            .filter_map(|extension| cells_end(memory, at + 4, cells, extension))
            .find(|run| data_starts_at(memory, run.end, n_layer))
        else {
            return Ok(None);
        };
        if let Some(position) = run.out_of_range {
            return Err(out_of_range(position));
        }
        if !run.owned {
            return Err(ownerless());
        }
        let last = stream + 1 == n_stream;
        let Some(next) = data_end(memory, run.end, cells, n_layer, last) else {
            return Ok(None);
        };
        at = next;
    }
    Ok(Some(at))
}

/// A run of cells as the walk read it.
pub struct CellRun {
    /// Where it ends.
    end: usize,
    /// Whether every cell names a sequence.
    owned: bool,
    /// The first position outside `0..=MAX_POSITION`, if any.
    out_of_range: Option<i32>,
}

/// The run of `cells` cells starting at `at`; `None` past the end of the state.
pub fn cells_end(state: &[u8], mut at: usize, cells: Option<u32>, extension: usize) -> Option<CellRun> {
    let mut owned = true;
    let mut out_of_range = None;
    for _ in 0..cells? {
        let position = word(state, at)?.cast_signed();
        if !(0..=MAX_POSITION).contains(&position) {
            out_of_range = out_of_range.or(Some(position));
        }
        let n_seq_id = usize::try_from(word(state, at + 4)?).ok()?;
        owned &= n_seq_id > 0;
        at = at
            .checked_add(CELL_HEAD_BYTES + extension)?
            .checked_add(n_seq_id.checked_mul(4)?)?;
        if at > state.len() {
            return None;
        }
    }
    Some(CellRun {
        end: at,
        owned,
        out_of_range,
    })
}

pub fn word(state: &[u8], at: usize) -> Option<u32> {
    let bytes = state.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// Whether a stream's data plausibly starts at `at`: `v_trans` then at most `n_layer` layers.
pub fn data_starts_at(state: &[u8], at: usize, n_layer: u32) -> bool {
    matches!((word(state, at), word(state, at + 4)), (Some(0 | 1), Some(layers)) if layers <= n_layer)
}

/// Where a stream's data starting at `at` ends: tried with V rows in every layer and in none
/// (the models llama.cpp knows), kept when the next stream's cells and data follow or, after
/// the `last` stream, when it fits.
pub fn data_end(state: &[u8], at: usize, cells: Option<u32>, n_layer: u32, last: bool) -> Option<usize> {
    let cells = u64::from(cells?);
    let v_trans = word(state, at)? == 1;
    let layers = word(state, at + 4)?;
    let k_end = rows_end(state, at + DATA_HEAD_BYTES, layers, cells, false)?;
    [layers, 0].into_iter().find_map(|v_layers| {
        let end = rows_end(state, k_end, v_layers, cells, v_trans)?;
        let next_cells = word(state, end);
        let next_is_empty = next_cells == Some(0);
        let next_has_data = [0, EXTENSION_BYTES]
            .into_iter()
            .filter_map(|extension| cells_end(state, end + 4, next_cells, extension))
            .any(|run| data_starts_at(state, run.end, n_layer));
        (last || next_is_empty || next_has_data).then_some(end)
    })
}

/// Where `layers` K or V sections of `cells` rows starting at `at` end.
pub fn rows_end(state: &[u8], mut at: usize, layers: u32, cells: u64, transposed: bool) -> Option<usize> {
    for _ in 0..layers {
        let bytes = if transposed {
            let element = u64::from(word(state, at + 4)?);
            let width = u64::from(word(state, at + 8)?);
            element.checked_mul(width)?.checked_mul(cells)?
        } else {
            let row = u64::from_le_bytes(state.get(at + 4..at + 12)?.try_into().ok()?);
            row.checked_mul(cells)?
        };
        at = at
            .checked_add(ROWS_HEAD_BYTES)?
            .checked_add(usize::try_from(bytes).ok()?)?;
        if at > state.len() {
            return None;
        }
    }
    Some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYERS: u32 = 2;

    /// A KV stream of cells `(position, sequence ids)`, each layer's K and V rows 4 bytes wide.
    pub fn stream(cells: &[(i32, &[u32])]) -> Vec<u32> {
        let mut words = vec![u32::try_from(cells.len()).unwrap()];
        if cells.is_empty() {
            return words;
        }
        for (position, seq_ids) in cells {
            words.extend([position.cast_unsigned(), u32::try_from(seq_ids.len()).unwrap()]);
            words.extend(seq_ids.iter());
        }
        words.extend([0, LAYERS, 0, 0]);
        for _ in 0..2 * LAYERS {
            words.extend([1, 4, 0]); // type, row size (u64: 4, 0)
            words.extend(std::iter::repeat_n(0, cells.len()));
        }
        words
    }

    pub fn state(streams: &[Vec<u32>]) -> Vec<u8> {
        let mut words = vec![u32::try_from(streams.len()).unwrap()];
        words.extend(streams.iter().flatten());
        words.iter().flat_map(|word| word.to_le_bytes()).collect()
    }

    #[test]
    pub fn finds_a_cell_without_a_sequence_in_any_stream() {
        let owned = stream(&[(0, &[0]), (1, &[0, 1])]);
        let ownerless = stream(&[(0, &[1]), (1, &[])]);
        let owned_state = state(std::slice::from_ref(&owned));
        assert!(check_owners(&owned_state, Memory::Kv, LAYERS).is_ok());
        assert!(check_owners(&state(&[owned.clone(), owned.clone()]), Memory::Kv, LAYERS).is_ok());
        assert!(check_owners(&state(&[ownerless.clone(), owned.clone()]), Memory::Kv, LAYERS).is_err());
        assert!(check_owners(&state(&[owned.clone(), ownerless.clone()]), Memory::Kv, LAYERS).is_err());
        assert!(check_owners(&state(&[owned.clone(), stream(&[])]), Memory::Kv, LAYERS).is_ok());
        assert!(check_owners(&state(&[stream(&[]), ownerless.clone()]), Memory::Kv, LAYERS).is_err());
        assert!(check_owners(&state(&[owned.clone(), stream(&[]), ownerless]), Memory::Kv, LAYERS).is_err());
    }

    #[test]
    pub fn finds_a_recurrent_cell_without_a_sequence() {
        let words = |n_seq_id: u32| [2, 5, 1, 0, 7, n_seq_id, 1];
        let bytes = |words: &[u32]| -> Vec<u8> { words.iter().flat_map(|word| word.to_le_bytes()).collect() };
        assert!(check_owners(&bytes(&words(1)), Memory::Recurrent, LAYERS).is_ok());
        assert!(check_owners(&bytes(&words(0)[..6]), Memory::Recurrent, LAYERS).is_err());
    }

    #[test]
    pub fn finds_where_a_hybrids_recurrent_part_starts() {
        let kv = state(&[stream(&[(0, &[0])]), stream(&[])]);
        let recurrent = |n_seq_id: u32| [1u32, 3, n_seq_id, 0].map(u32::to_le_bytes).concat();
        let hybrid = |n_seq_id: u32| [kv.clone(), recurrent(n_seq_id)].concat();
        assert_eq!(kv_part_end(&hybrid(1), LAYERS).unwrap(), Some(kv.len()));
        assert!(check_owners(&hybrid(1), Memory::Hybrid, LAYERS).is_ok());
        assert!(check_owners(&hybrid(0)[..kv.len() + 12], Memory::Hybrid, LAYERS).is_err());
    }

    #[test]
    pub fn finds_positions_out_of_range_with_and_without_the_extension() {
        // Extension words that do not also read as cells without one (the walk tries both).
        let with_extension = |positions: &[i32]| -> Vec<u8> {
            let mut words = vec![1, u32::try_from(positions.len()).unwrap()];
            for &position in positions {
                words.extend([position.cast_unsigned(), 1, 9, 9, 100_000, 0]);
            }
            words.extend([0, LAYERS, 0, 0]);
            words.iter().flat_map(|word| word.to_le_bytes()).collect()
        };
        for positions in [[0, 1], [0, MAX_POSITION]] {
            let cells: Vec<(i32, &[u32])> = positions.iter().map(|&position| (position, &[0u32][..])).collect();
            assert!(kv_part_end(&state(&[stream(&cells)]), LAYERS).is_ok());
            assert!(kv_part_end(&with_extension(&positions), LAYERS).is_ok());
        }
        for position in [i32::MAX, -1] {
            let cells: Vec<(i32, &[u32])> = vec![(0, &[0]), (position, &[0])];
            assert!(kv_part_end(&state(&[stream(&cells)]), LAYERS).is_err());
            assert!(kv_part_end(&with_extension(&[0, position]), LAYERS).is_err());
            assert!(check_owners(&state(&[stream(&cells)]), Memory::Kv, LAYERS).is_err());
        }
    }

    #[test]
    pub fn a_recurrent_sequence_state_is_one_cell() {
        let cells = |count: u32| count.to_le_bytes().to_vec();
        assert!(check_recurrent_cells(&cells(0), 0).is_ok());
        assert!(check_recurrent_cells(&cells(1), 0).is_ok());
        assert!(check_recurrent_cells(&cells(2), 0).is_err());
    }

    #[test]
    pub fn unknown_layouts_and_truncated_states_pass_to_llama_cpp() {
        assert!(check_owners(&[0; 3], Memory::Kv, LAYERS).is_ok());
        let mut truncated = state(&[stream(&[(0, &[])])]);
        truncated.truncate(12);
        assert!(check_owners(&truncated, Memory::Kv, LAYERS).is_ok());
        assert!(check_owners(&[9, 0, 0, 0], Memory::Recurrent, LAYERS).is_ok());
    }
}
