//! The cells of a sequence state, read before llama.cpp restores them [llama.cpp internal].
//! (The layout described here is a KV cache's; `check_recurrent_cells` reads recurrent memory's.)
//!
//! llama.cpp takes a sequence state's positions as they are. A cell at 2**31 - 1 can then never
//! be removed by any range (`seq_rm` covers positions below its end, and the largest end is
//! 2**31 - 1), not even by the rollback of the failed restore, so such states are refused
//! before they reach the KV cache. Layout: the `io_magic` and a sequence id, the stream count,
//! then per stream a cell count and, where it is not zero (one stream holds the sequence), each
//! cell's position, sequence count (1), optional 12-byte extension and sequence id, followed by
//! the stream's data, which starts with `v_trans` (0 or 1) and the number of layers.

use crate::batch::MAX_POSITION;
use crate::errors::{Error, Result};

/// A cell without and with llama.cpp's extension (M-RoPE positions, token id).
const CELL_BYTES: [usize; 2] = [12, 24];

pub(super) fn word(state: &[u8], at: usize) -> Option<u32> {
    let bytes = state.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// Whether the stream's data plausibly starts at `at`: `v_trans` then at most `n_layer` layers.
pub(super) fn data_starts_at(state: &[u8], at: usize, n_layer: u32) -> bool {
    matches!((word(state, at), word(state, at + 4)), (Some(0 | 1), Some(layers)) if layers <= n_layer)
}

/// `StateError` for a sequence state holding a position outside `0..=MAX_POSITION`. A layout
/// this walk does not recognise (e.g. recurrent memory) passes: llama.cpp checks it, and the
/// restore checks positions afterwards.
pub fn check_positions(state: &[u8], n_layer: u32) -> Result<()> {
    let Some(n_stream) = word(state, 8) else { return Ok(()) };
    let mut at = 12;
    for _ in 0..n_stream {
        let Some(cells) = word(state, at).and_then(|cells| usize::try_from(cells).ok()) else {
            return Ok(());
        };
        at += 4;
        if cells == 0 {
            continue;
        }
        let stride = CELL_BYTES.into_iter().find(|&stride| {
            cells
                .checked_mul(stride)
                .is_some_and(|size| data_starts_at(state, at + size, n_layer))
        });
        let Some(stride) = stride else { return Ok(()) };
        for cell in 0..cells {
            let position = word(state, at + cell * stride).map_or(0, |bits| bits.cast_signed());
            if !(0..=MAX_POSITION).contains(&position) {
                return Err(Error::state(
                    "Positions",
                    format!("the sequence state puts a cell at position {position}, outside 0..={MAX_POSITION}"),
                ));
            }
        }
        return Ok(());
    }
    Ok(())
}

/// `StateError` for a sequence state whose recurrent part, at `at`, holds more than one cell.
/// A recurrent sequence is one cell (its state), and a state llama.cpp writes holds 0 or 1; it
/// restores any other count into that one cell and then asserts that each position got a cell
/// of its own (`llama-memory-recurrent.cpp:1051`). The part starts with the cell count.
pub fn check_recurrent_cells(state: &[u8], at: usize) -> Result<()> {
    match word(state, at) {
        Some(cells) if cells > 1 => Err(Error::state(
            "Cells",
            format!("the sequence state holds {cells} cells; a recurrent model's sequence is one"),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(positions: &[i32], extension: bool) -> Vec<u8> {
        let mut words: Vec<u32> = vec![0xaf14_3cd8, 0, 2, 0, u32::try_from(positions.len()).unwrap()];
        for &position in positions {
            words.extend([position.cast_unsigned(), 1]);
            if extension {
                words.extend([0, 0, 7]);
            }
            words.push(0);
        }
        words.extend([0, 30]);
        words.iter().flat_map(|word| word.to_le_bytes()).collect()
    }

    #[test]
    fn finds_positions_with_and_without_the_extension() {
        for extension in [false, true] {
            assert!(check_positions(&state(&[0, 1, 2], extension), 30).is_ok());
            assert!(check_positions(&state(&[0, i32::MAX], extension), 30).is_err());
            assert!(check_positions(&state(&[-1, 0], extension), 30).is_err());
        }
    }

    #[test]
    fn unknown_layouts_and_truncated_states_pass_to_llama_cpp() {
        assert!(check_positions(&state(&[i32::MAX], false), 10).is_ok());
        assert!(check_positions(&[0; 10], 30).is_ok());
    }
}
