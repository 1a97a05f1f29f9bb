//! The framing of llama.cpp's RPC protocol, as much of it as the relay needs: where a message
//! ends, whether it is answered, and an answer of the right size when the server is gone.
//!
//! A request is `command (u8) | size (u64 LE) | payload`; an answer, where the command has one,
//! is `size (u64 LE) | payload`. The layouts are ggml-rpc.cpp's packed structs for protocol
//! 8.0 (the version of the llama.cpp this extension is built from) [llama.cpp internal].

use std::io::{self, Read, Write};

/// `RPC_PROTO_MAJOR_VERSION`, `_MINOR_`, `_PATCH_` of the bundled `ggml-rpc.h` (the sys crate's
/// bindings leave them out). `tests/test_rpc.py` connects to a server of this build, which
/// fails should they differ.
pub const VERSION: (u8, u8, u8) = (8, 0, 1);

pub const HELLO: u8 = 14;
const DEVICE_COUNT: u8 = 15;
pub const ALLOC_BUFFER: u8 = 0;
const GET_ALIGNMENT: u8 = 1;
const GET_MAX_SIZE: u8 = 2;
const BUFFER_GET_BASE: u8 = 3;
const SET_TENSOR_HASH: u8 = 7;
const GET_TENSOR: u8 = 8;
const COPY_TENSOR: u8 = 9;
const GET_DEVICE_MEMORY: u8 = 11;
const GET_ALLOC_SIZE: u8 = 13;
const GET_TENSOR_2D: u8 = 19;
const COMM_INIT: u8 = 20;
/// `RPC_CMD_COUNT`: commands at or past it make the server drop the connection.
const COMMAND_COUNT: u8 = 24;

/// `sizeof(rpc_tensor)`: id, type, buffer, ne[4], nb[4], op, op_params[16], flags, src[10],
/// view_src, view_offs, data, name[64], use_count.
const TENSOR_SIZE: usize = 8 + 4 + 8 + 16 + 16 + 4 + 64 + 4 + 80 + 8 + 8 + 8 + 64 + 4;
/// `conn_caps`: transport upgrades (RDMA) both sides offer in HELLO.
const CAPS_SIZE: usize = 24;
pub const HELLO_REQUEST_SIZE: usize = CAPS_SIZE;
pub const HELLO_ANSWER_SIZE: usize = 4 + CAPS_SIZE;
/// The largest request the relay buffers: a tensor upload of the largest model layer fits.
const MAX_REQUEST: u64 = 1 << 40;

/// One request as read from the client.
pub struct Request {
    pub command: u8,
    pub payload: Vec<u8>,
}

impl Request {
    /// Reads one request; `None` at a clean end of the stream before a new request.
    pub fn read(from: &mut impl Read) -> io::Result<Option<Self>> {
        let mut command = [0u8; 1];
        match from.read_exact(&mut command) {
            Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(err) => return Err(err),
            Ok(()) if command[0] >= COMMAND_COUNT => {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "unknown RPC command"));
            }
            Ok(()) => {}
        }
        let size = read_u64(from)?;
        if size > MAX_REQUEST {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "RPC request too large"));
        }
        let mut payload = vec![0u8; usize::try_from(size).map_err(io::Error::other)?];
        from.read_exact(&mut payload)?;
        Ok(Some(Self {
            command: command[0],
            payload,
        }))
    }

    pub fn write(&self, to: &mut impl Write) -> io::Result<()> {
        to.write_all(&[self.command])?;
        to.write_all(&(self.payload.len() as u64).to_le_bytes())?;
        to.write_all(&self.payload)?;
        to.flush()
    }

    /// The size of the answer the client waits for, or `None` for a command it does not await.
    pub fn answer_size(&self) -> Option<u64> {
        let field = |offset: usize| {
            self.payload
                .get(offset..offset + 8)
                .and_then(|bytes| bytes.try_into().ok())
                .map_or(0, u64::from_le_bytes)
        };
        match self.command {
            HELLO => Some(HELLO_ANSWER_SIZE as u64),
            DEVICE_COUNT => Some(4),
            ALLOC_BUFFER | GET_DEVICE_MEMORY => Some(16),
            GET_ALIGNMENT | GET_MAX_SIZE | BUFFER_GET_BASE | GET_ALLOC_SIZE => Some(8),
            SET_TENSOR_HASH | COPY_TENSOR | COMM_INIT => Some(1),
            // rpc_msg_get_tensor_req: tensor, offset, size.
            GET_TENSOR => Some(field(TENSOR_SIZE + 8)),
            // rpc_msg_get_tensor_2d_req: tensor, offset, size, n_copies, stride.
            GET_TENSOR_2D => Some(field(TENSOR_SIZE + 8).saturating_mul(field(TENSOR_SIZE + 16))),
            _ => None,
        }
    }

    /// An answer that lets the client finish what it is doing once its server is gone; the
    /// relay has recorded the failure, and llamactx raises it before anyone reads a result.
    /// Values the client checks are plausible: a non-null buffer, a power-of-two alignment.
    pub fn stand_in_answer(&self, size: u64) -> Vec<u8> {
        let mut answer = vec![0u8; usize::try_from(size).unwrap_or(0)];
        let mut put = |offset: usize, value: u64| {
            if let Some(slot) = answer.get_mut(offset..offset + 8) {
                slot.copy_from_slice(&value.to_le_bytes());
            }
        };
        match self.command {
            HELLO => {
                let (major, minor, patch) = VERSION;
                answer[..3].copy_from_slice(&[major, minor, patch]);
            }
            DEVICE_COUNT => answer[..4].copy_from_slice(&1u32.to_le_bytes()),
            ALLOC_BUFFER => {
                // rpc_msg_alloc_buffer_req: device (u32), size (u64).
                let requested = self
                    .payload
                    .get(4..12)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u64::from_le_bytes);
                put(0, STAND_IN_ADDRESS);
                put(8, requested);
            }
            GET_ALIGNMENT => put(0, 32),
            GET_MAX_SIZE => put(0, u64::MAX),
            BUFFER_GET_BASE => put(0, STAND_IN_ADDRESS),
            GET_DEVICE_MEMORY => {
                put(0, 1 << 30);
                put(8, 1 << 30);
            }
            SET_TENSOR_HASH | COPY_TENSOR | COMM_INIT => answer[0] = 1,
            _ => {}
        }
        answer
    }

    /// Clears the transport capabilities of a HELLO request, so that the server never offers an
    /// upgrade (RDMA) the relay could not pass on.
    pub fn clear_capabilities(&mut self) {
        if self.command == HELLO {
            self.payload.fill(0);
        }
    }
}

/// A remote address no client dereferences: it only sends it back to the server.
const STAND_IN_ADDRESS: u64 = 0x1000;

/// Reads an answer of exactly `expected` bytes.
pub fn read_answer(from: &mut impl Read, expected: u64) -> io::Result<Vec<u8>> {
    let size = read_u64(from)?;
    if size != expected {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("answer of {size} bytes where {expected} were expected"),
        ));
    }
    let mut answer = vec![0u8; usize::try_from(size).map_err(io::Error::other)?];
    from.read_exact(&mut answer)?;
    Ok(answer)
}

pub fn write_answer(to: &mut impl Write, answer: &[u8]) -> io::Result<()> {
    to.write_all(&(answer.len() as u64).to_le_bytes())?;
    to.write_all(answer)?;
    to.flush()
}

/// The server's protocol version from a HELLO answer, with its capabilities cleared.
pub fn hello_version(answer: &mut [u8]) -> (u8, u8, u8) {
    answer[4..].fill(0);
    (answer[0], answer[1], answer[2])
}

/// Whether a client of `VERSION` accepts a server of `server` (ggml-rpc's own rule).
pub fn compatible(server: (u8, u8, u8)) -> bool {
    server.0 == VERSION.0 && server.1 <= VERSION.1
}

fn read_u64(from: &mut impl Read) -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    from.read_exact(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(command: u8, payload: Vec<u8>) -> Request {
        Request { command, payload }
    }

    #[test]
    fn tensor_reads_answer_the_size_they_ask_for() {
        let mut payload = vec![0u8; TENSOR_SIZE + 16];
        payload[TENSOR_SIZE + 8..].copy_from_slice(&4096u64.to_le_bytes());
        assert_eq!(request(GET_TENSOR, payload).answer_size(), Some(4096));
        let mut payload = vec![0u8; TENSOR_SIZE + 32];
        payload[TENSOR_SIZE + 8..TENSOR_SIZE + 16].copy_from_slice(&100u64.to_le_bytes());
        payload[TENSOR_SIZE + 16..TENSOR_SIZE + 24].copy_from_slice(&3u64.to_le_bytes());
        assert_eq!(request(GET_TENSOR_2D, payload).answer_size(), Some(300));
        // GRAPH_COMPUTE and SET_TENSOR are not answered.
        assert_eq!(request(10, vec![]).answer_size(), None);
        assert_eq!(request(6, vec![]).answer_size(), None);
    }

    #[test]
    fn stand_in_answers_have_the_awaited_size_and_plausible_values() {
        let mut alloc = vec![0u8; 12];
        alloc[4..].copy_from_slice(&1000u64.to_le_bytes());
        let alloc = request(ALLOC_BUFFER, alloc);
        let answer = alloc.stand_in_answer(alloc.answer_size().unwrap_or_default());
        assert_eq!(answer.len(), 16);
        assert_ne!(u64::from_le_bytes(answer[..8].try_into().unwrap_or_default()), 0);
        assert_eq!(u64::from_le_bytes(answer[8..].try_into().unwrap_or_default()), 1000);
        let hello = request(HELLO, vec![0; HELLO_REQUEST_SIZE]);
        let mut answer = hello.stand_in_answer(HELLO_ANSWER_SIZE as u64);
        assert!(compatible(hello_version(&mut answer)));
    }

    #[test]
    fn frames_round_trip() {
        let sent = request(GET_ALIGNMENT, vec![1, 2, 3, 4]);
        let mut wire = Vec::new();
        sent.write(&mut wire).unwrap_or_default();
        let read = Request::read(&mut wire.as_slice()).ok().flatten();
        assert_eq!(
            read.map(|r| (r.command, r.payload)),
            Some((GET_ALIGNMENT, vec![1, 2, 3, 4]))
        );
        assert!(Request::read(&mut [99u8, 0].as_slice()).is_err());
    }

    #[test]
    fn version_rule_is_ggml_rpcs() {
        let (major, minor, patch) = VERSION;
        assert!(compatible((major, minor, patch.wrapping_add(1))));
        assert!(!compatible((major.wrapping_add(1), minor, patch)));
        assert!(!compatible((major, minor.wrapping_add(1), patch)));
    }
}
