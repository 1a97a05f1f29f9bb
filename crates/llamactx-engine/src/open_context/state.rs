//! Saving and restoring context state: whole-context and per-sequence, in memory and in files,
//! plus the older session-file API.
//!
//! llama.cpp's state holds the KV memory but no logits, so after any restore no output row
//! has logits (`get_logits*` raise `IndexError`) until the next decode. Every buffer is sized
//! exactly: the crate's `copy_state_data`/`set_state_data` pass unbounded pointers and are
//! never used.

use std::path::Path;

use llama_cpp_4::token::LlamaToken;

use super::state_layout::{self, Memory};
use super::OpenContext;
use crate::backend::explained;
use crate::batch::MAX_POSITION;
use crate::errors::{Error, Result};

/// The largest token buffer a load may ask for (64 MiB of ids): a guard against a typo that
/// would make the allocation abort the process.
pub const MAX_TOKEN_CAPACITY: usize = 1 << 24;

/// `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`; the only flag besides none that is safe from Python.
/// `ON_DEVICE` (2) leaves the data in device buffers that llama.cpp frees on the next get, so
/// restoring an older copy would read freed memory.
pub const SEQ_FLAGS_ALLOWED: u32 = llama_cpp_sys_4::LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY;

pub fn check_flags(flags: u32) -> Result<u32> {
    if flags & !SEQ_FLAGS_ALLOWED == 0 {
        Ok(flags)
    } else {
        Err(Error::value(format!(
            "unsupported state flags {flags}: only 0 and LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY (1) are allowed"
        )))
    }
}

pub fn check_capacity(capacity: usize) -> Result<usize> {
    if capacity > MAX_TOKEN_CAPACITY {
        return Err(Error::value(format!(
            "token capacity {capacity} is larger than {MAX_TOKEN_CAPACITY}"
        )));
    }
    Ok(capacity)
}

pub fn read_state(size: usize, get: impl FnOnce(&mut [u8]) -> usize) -> Result<Vec<u8>> {
    let mut buffer = vec![0; size];
    let written = get(&mut buffer);
    if written == 0 || written > size {
        return Err(Error::state(
            "GetData",
            format!("llama.cpp wrote {written} of {size} state bytes"),
        ));
    }
    buffer.truncate(written);
    Ok(buffer)
}

/// llama.cpp's `io_magic` (llama-context.cpp), the first word of in-memory sequence states
/// [llama.cpp internal].
/// Pinned with llama-cpp-4 0.11.0; `test_sequence_state_file_round_trip` fails if it moves.
pub const SEQ_STATE_IO_MAGIC: u32 = 0xaf14_3cd8;

/// Why a state file's header was refused.
pub enum Refusal {
    /// Not a file of this kind (magic, version), or cut short before its state.
    Invalid(&'static str),
    /// More tokens than the caller has room for.
    TooManyTokens(usize),
}

/// Splits a state file (`magic`, `version`, a token count, the tokens, the state) into its
/// tokens and its state bytes.
pub fn split_state_file(
    file: &[u8],
    magic: u32,
    version: u32,
    capacity: usize,
) -> std::result::Result<(Vec<i32>, &[u8]), Refusal> {
    let word = |at: usize| {
        file.get(at..at + 4)
            .and_then(|bytes| bytes.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or(Refusal::Invalid("truncated header"))
    };
    if word(0)? != magic || word(4)? != version {
        return Err(Refusal::Invalid("unknown magic or version"));
    }
    let count = usize::try_from(word(8)?).map_err(|_| Refusal::Invalid("token count"))?;
    if count > capacity {
        return Err(Refusal::TooManyTokens(count));
    }
    let state_at = 12 + 4 * count;
    let tokens = file.get(12..state_at).ok_or(Refusal::Invalid("truncated token list"))?;
    let tokens = tokens
        .chunks_exact(4)
        .map(|chunk| i32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]));
    Ok((tokens.collect(), &file[state_at..]))
}

/// Splits a sequence state file (`LLAMA_STATE_SEQ_MAGIC`, version, token count, tokens, state)
/// into its tokens and its state bytes.
pub fn parse_seq_state_file(file: &[u8], capacity: usize) -> Result<(Vec<i32>, &[u8])> {
    let (magic, version) = (
        llama_cpp_sys_4::LLAMA_STATE_SEQ_MAGIC,
        llama_cpp_sys_4::LLAMA_STATE_SEQ_VERSION,
    );
    split_state_file(file, magic, version, capacity).map_err(|refusal| match refusal {
        Refusal::Invalid(why) => Error::state("SeqLoadFile", format!("not a valid sequence state file: {why}")),
        Refusal::TooManyTokens(count) => Error::state(
            "SeqLoadFile",
            format!("the file holds {count} tokens, more than {capacity}"),
        ),
    })
}

/// The start of a whole state: the model architecture's name, behind its length
/// [llama.cpp internal]. llama.cpp allocates that length as read (up to 4 GiB) before it
/// checks anything, so restores compare it with this context's own first.
pub fn architecture_header(state: &[u8]) -> &[u8] {
    let length = state
        .get(..4)
        .and_then(|word| word.try_into().ok())
        .map_or(0, |word| u32::from_le_bytes(word) as usize);
    state.get(..4 + length).unwrap_or(state)
}

pub fn foreign_state() -> Error {
    Error::state(
        "ForeignState",
        "this state was not saved by a model of this architecture (or is corrupt)",
    )
}

impl OpenContext {
    /// `StateError` for a whole state's memory (what follows its architecture name) holding a
    /// cell that belongs to no sequence (see `state_layout`).
    pub fn check_cell_owners(&self, memory: &[u8]) -> Result<()> {
        state_layout::check_owners(memory, self.memory_kind(), self.n_layer())
    }

    pub fn n_layer(&self) -> u32 {
        u32::try_from(self.model().n_layer()).unwrap_or(0)
    }

    pub fn memory_kind(&self) -> Memory {
        if self.model().is_recurrent() {
            Memory::Recurrent
        } else if self.model().is_hybrid() {
            Memory::Hybrid
        } else {
            Memory::Kv
        }
    }

    /// Restoring state leaves llama.cpp without outputs (see the module comment).
    pub fn forget_outputs(&mut self) {
        self.output_rows.clear();
    }

    pub fn state_bytes(&mut self) -> Result<Vec<u8>> {
        self.with_mut(|context| {
            let size = context.state_get_size();
            read_state(size, |buffer| context.state_get_data(buffer))
        })
    }

    /// Runs a restore of the whole state as a transaction: llama.cpp may fail after clearing or
    /// partly writing the KV cache, so the state before is kept and put back on failure. The
    /// error carries what llama.cpp logged.
    /// `restore` gets the state before, whose first bytes are this model's own state header.
    pub fn restore_all<T>(&mut self, restore: impl FnOnce(&mut Self, &[u8]) -> Result<T>) -> Result<T> {
        let before = self.state_bytes()?;
        let n_seq_max = self.with(|context| context.n_seq_max());
        let result = explained(|| restore(self, &before)).and_then(|value| {
            (0..n_seq_max)
                .filter_map(|seq| i32::try_from(seq).ok())
                .try_for_each(|seq| self.check_restored_positions(seq))?;
            Ok(value)
        });
        self.forget_outputs();
        result.inspect_err(|_| {
            self.with_mut(|context| context.state_set_data(&before));
        })
    }

    /// `restore_all` for one sequence's state.
    pub fn restore_seq<T>(&mut self, seq_id: i32, restore: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let before = self.seq_state_bytes(seq_id, 0)?;
        let result = explained(|| restore(self)).and_then(|value| {
            self.check_restored_positions(seq_id)?;
            Ok(value)
        });
        self.forget_outputs();
        result.inspect_err(|_| {
            self.with_mut(|context| context.state_seq_set_data_ext(&before, seq_id, 0));
        })
    }

    /// llama.cpp takes a state's positions as they are: a negative one, or one at 2**31 - 1
    /// that no range can remove, would silently corrupt the sequence (see `MAX_POSITION`).
    pub fn check_restored_positions(&self, seq_id: i32) -> Result<()> {
        let (first, last) =
            self.with(|context| (context.memory_seq_pos_min(seq_id), context.kv_cache_seq_pos_max(seq_id)));
        let empty = first == -1 && last == -1;
        if empty || (first >= 0 && last <= MAX_POSITION) {
            return Ok(());
        }
        Err(Error::state(
            "Positions",
            format!(
                "the state puts sequence {seq_id} at positions {first}..={last}, outside 0..={MAX_POSITION}; \
                 nothing was restored"
            ),
        ))
    }

    /// Restores the whole state from `src`; returns the bytes llama.cpp read, which must be all
    /// of them where `whole`.
    pub fn set_state_bytes(&mut self, src: &[u8], whole: bool) -> Result<usize> {
        self.restore_all(|native, before| {
            let header = architecture_header(before);
            if !src.starts_with(header) {
                return Err(foreign_state());
            }
            native.check_cell_owners(&src[header.len()..])?;
            match native.with_mut(|context| context.state_set_data(src)) {
                0 => Err(Error::state("SetData", "llama.cpp rejected the state data")),
                read if whole && read != src.len() => Err(Error::state(
                    "SetData",
                    format!("the state has {} bytes after its end", src.len() - read),
                )),
                read => Ok(read),
            }
        })
    }

    /// Restores a whole-state file (`save_session_file`'s and `state_save_file`'s format) and
    /// returns its tokens. The file is read here and restored from memory, by llama.cpp's buffer
    /// reader, which checks every length: its file reader reads nothing past the end of a
    /// truncated file and goes on with whatever its buffer held, so a count read there could
    /// drive it through billions of reads [llama.cpp internal]. `refused` makes the error for a
    /// file that is not one, or holds more than `capacity` tokens.
    pub fn load_state_file(
        &mut self,
        path: &Path,
        capacity: usize,
        refused: impl Fn(Refusal) -> Error,
    ) -> Result<Vec<i32>> {
        let file = std::fs::read(path).map_err(|err| Error::state("LoadFile", err.to_string()))?;
        let (magic, version) = (
            llama_cpp_sys_4::LLAMA_SESSION_MAGIC,
            llama_cpp_sys_4::LLAMA_SESSION_VERSION,
        );
        let (tokens, state) = split_state_file(&file, magic, version, capacity).map_err(refused)?;
        self.set_state_bytes(state, true)?;
        Ok(tokens)
    }

    pub fn seq_state_bytes(&mut self, seq_id: i32, flags: u32) -> Result<Vec<u8>> {
        self.with_mut(|context| {
            let size = context.state_seq_get_size_ext(seq_id, flags);
            read_state(size, |buffer| context.state_seq_get_data_ext(buffer, seq_id, flags))
        })
    }

    /// Sequence `seq_id`'s cells as llama.cpp's sequence state file (`state_seq_save_file`'s
    /// bytes, in memory), holding `tokens` as the file's token list.
    pub fn seq_state_file(&mut self, seq_id: i32, tokens: &[LlamaToken]) -> Result<Vec<u8>> {
        let state = self.seq_state_bytes(seq_id, 0)?;
        // The file holds the in-memory state without its `io_magic` and sequence id.
        let body = match state.get(..4).map(|word| word == SEQ_STATE_IO_MAGIC.to_le_bytes()) {
            Some(true) => &state[8.min(state.len())..],
            _ => {
                return Err(Error::state(
                    "SeqSaveFile",
                    "llama.cpp wrote a sequence state of another layout",
                ))
            }
        };
        let count = u32::try_from(tokens.len()).map_err(|_| Error::value("too many tokens for a state file"))?;
        let mut file = Vec::with_capacity(12 + 4 * tokens.len() + body.len());
        for word in [
            llama_cpp_sys_4::LLAMA_STATE_SEQ_MAGIC,
            llama_cpp_sys_4::LLAMA_STATE_SEQ_VERSION,
            count,
        ] {
            file.extend_from_slice(&word.to_le_bytes());
        }
        file.extend(tokens.iter().flat_map(|token| token.0.to_le_bytes()));
        file.extend_from_slice(body);
        Ok(file)
    }

    /// Restores a sequence state file (`seq_state_file`'s, or llama.cpp's) into `dest_seq_id`
    /// and returns its tokens (at most `capacity`). The file is parsed here and its state handed
    /// to `set_seq_state_bytes`: llama.cpp's own file loader asserts (aborts) on some truncated
    /// files, its buffer loader reports them.
    pub fn restore_seq_state_file(&mut self, file: &[u8], dest_seq_id: i32, capacity: usize) -> Result<Vec<i32>> {
        let (tokens, state) = parse_seq_state_file(file, capacity)?;
        // The in-memory form is the file's state behind llama.cpp's `io_magic` and a sequence id
        // (which the reader skips).
        let mut buffer = Vec::with_capacity(state.len() + 8);
        buffer.extend_from_slice(&SEQ_STATE_IO_MAGIC.to_le_bytes());
        buffer.extend_from_slice(&dest_seq_id.to_le_bytes());
        buffer.extend_from_slice(state);
        let read = self.set_seq_state_bytes(&buffer, dest_seq_id, 0)?;
        if read != buffer.len() {
            return Err(Error::state(
                "SeqLoadFile",
                "the sequence state file has trailing bytes",
            ));
        }
        Ok(tokens)
    }

    pub fn set_seq_state_bytes(&mut self, src: &[u8], dest_seq_id: i32, flags: u32) -> Result<usize> {
        // After `io_magic` and the sequence id.
        const MEMORY_AT: usize = 8;
        let n_layer = self.n_layer();
        // With `PARTIAL_ONLY`, a KV cache without a sliding window writes nothing.
        let has_kv_part = flags & SEQ_FLAGS_ALLOWED == 0 || self.model().n_swa() > 0;
        match self.memory_kind() {
            Memory::Recurrent => state_layout::check_recurrent_cells(src, MEMORY_AT)?,
            Memory::Hybrid if !has_kv_part => state_layout::check_recurrent_cells(src, MEMORY_AT)?,
            kind => {
                let memory = src.get(MEMORY_AT..).unwrap_or_default();
                if let (Memory::Hybrid, Some(end)) = (kind, state_layout::kv_part_end(memory, n_layer)?) {
                    state_layout::check_recurrent_cells(memory, end)?;
                }
            }
        }
        self.restore_seq(dest_seq_id, |native| {
            match native.with_mut(|context| context.state_seq_set_data_ext(src, dest_seq_id, flags)) {
                0 => Err(Error::state("SeqSetData", "llama.cpp rejected the sequence state data")),
                read => Ok(read),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(words: &[u32], state: &[u8]) -> Vec<u8> {
        let mut bytes: Vec<u8> = words.iter().flat_map(|word| word.to_le_bytes()).collect();
        bytes.extend_from_slice(state);
        bytes
    }

    #[test]
    fn parses_a_sequence_state_file() {
        let magic = llama_cpp_sys_4::LLAMA_STATE_SEQ_MAGIC;
        let version = llama_cpp_sys_4::LLAMA_STATE_SEQ_VERSION;
        let good = file(&[magic, version, 2, 7, 9], b"state");
        let (tokens, state) = parse_seq_state_file(&good, 8).unwrap();
        assert_eq!((tokens, state), (vec![7, 9], &b"state"[..]));
        assert!(parse_seq_state_file(&good, 1).is_err());
        assert!(parse_seq_state_file(&good[..14], 8).is_err());
        assert!(parse_seq_state_file(&file(&[magic, version + 1, 0], b""), 8).is_err());
    }
}
