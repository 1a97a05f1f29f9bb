//! The framing of llama.cpp's RPC protocol, as much of it as the relay needs: where a message
//! ends, whether it is answered, and an answer of the right size when the server is gone.
//!
//! A request is `command (u8) | size (u64 LE) | payload`; an answer, where the command has one,
//! is `size (u64 LE) | payload`. The layouts are ggml-rpc.cpp's packed structs for protocol
//! 8.0 (the version of the llama.cpp this extension is built from) [llama.cpp internal].

use std::io::{self, Read, Write};

/// `RPC_PROTO_MAJOR_VERSION`, `_MINOR_`, `_PATCH_` of the bundled `ggml-rpc.h` (the sys crate's
/// bindings leave them out). `tests/distributed/test_rpc.py` connects to a server of this build, which
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
        let field = |offset| u64_at(&self.payload, offset);
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
                put(0, STAND_IN_ADDRESS);
                put(8, self.requested_buffer_size());
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

    /// Why `answer` (of the awaited size) holds a value llama.cpp would act on unchecked, if it
    /// does: a device count it makes that many devices for, an alignment its allocators assume a
    /// power of two, sizes and addresses its pointer arithmetic would overflow with.
    pub fn refuse_answer(&self, answer: &[u8]) -> Option<String> {
        let field = |offset| u64_at(answer, offset);
        let refused =
            |what: &str, value: u64| Some(format!("the server answered {what} {value}, which llamactx refuses"));
        match self.command {
            DEVICE_COUNT => {
                let count = answer
                    .get(..4)
                    .and_then(|bytes| bytes.try_into().ok())
                    .map_or(0, u32::from_le_bytes);
                (count == 0 || count > MAX_DEVICES).then(|| {
                    format!("the server reports {count} devices; llamactx takes 1 to {MAX_DEVICES} from a server")
                })
            }
            GET_ALIGNMENT => {
                let alignment = field(0);
                (!alignment.is_power_of_two() || alignment > MAX_ALIGNMENT)
                    .then(|| refused("an alignment of", alignment))
                    .flatten()
            }
            GET_MAX_SIZE if field(0) == 0 => refused("a largest buffer size of", 0),
            // rpc_msg_alloc_buffer_rsp: remote_ptr, remote_size (a null pointer is a refusal the
            // client handles).
            ALLOC_BUFFER => {
                let requested = self.requested_buffer_size();
                let (pointer, size) = (field(0), field(8));
                if pointer != 0 && (pointer > MAX_ADDRESS || size < requested || size > MAX_ADDRESS) {
                    Some(format!(
                        "the server answered a buffer of {size} bytes at {pointer:#x} for {requested} bytes, which \
                         llamactx refuses"
                    ))
                } else {
                    None
                }
            }
            BUFFER_GET_BASE if field(0) == 0 || field(0) > MAX_ADDRESS || field(0) % TENSOR_ALIGNMENT != 0 => {
                refused("a buffer base of", field(0))
            }
            GET_ALLOC_SIZE if field(0) > MAX_ADDRESS => refused("an allocation size of", field(0)),
            _ => None,
        }
    }

    /// The size an ALLOC_BUFFER request asks for (rpc_msg_alloc_buffer_req: device (u32), size
    /// (u64)).
    fn requested_buffer_size(&self) -> u64 {
        u64_at(&self.payload, 4)
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

/// The most devices one server may report: ggml-rpc makes a device object for each.
const MAX_DEVICES: u32 = 64;
/// The largest buffer alignment taken from a server: every tensor is padded to it.
const MAX_ALIGNMENT: u64 = 1 << 16;
/// Remote addresses and sizes stay below 2**56, so that ggml's `base + offset + size`
/// arithmetic (and its bounds asserts) cannot wrap.
const MAX_ADDRESS: u64 = 1 << 56;
/// ggml's `TENSOR_ALIGNMENT`: buffer bases are aligned to it.
const TENSOR_ALIGNMENT: u64 = 32;

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

/// The little-endian u64 at `offset` of `bytes` (0 past their end).
fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    bytes
        .get(offset..offset + 8)
        .and_then(|bytes| bytes.try_into().ok())
        .map_or(0, u64::from_le_bytes)
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
    fn answers_llama_cpp_would_act_on_unchecked_are_refused() {
        let count = |n: u32| request(DEVICE_COUNT, vec![]).refuse_answer(&n.to_le_bytes());
        assert!(count(0).is_some() && count(u32::MAX).is_some() && count(1).is_none());
        let alignment = |n: u64| request(GET_ALIGNMENT, vec![0; 4]).refuse_answer(&n.to_le_bytes());
        assert!(alignment(0).is_some() && alignment(48).is_some() && alignment(1 << 40).is_some());
        assert!(alignment(32).is_none());
        let mut alloc = vec![0u8; 12];
        alloc[4..].copy_from_slice(&1000u64.to_le_bytes());
        let answer = |pointer: u64, size: u64| [pointer.to_le_bytes(), size.to_le_bytes()].concat();
        let alloc = request(ALLOC_BUFFER, alloc);
        assert!(alloc.refuse_answer(&answer(0x1000, 999)).is_some());
        assert!(alloc.refuse_answer(&answer(u64::MAX - 8, 1000)).is_some());
        assert!(alloc.refuse_answer(&answer(0x1000, 1000)).is_none());
        assert!(alloc.refuse_answer(&answer(0, 0)).is_none());
        let base = |pointer: u64| request(BUFFER_GET_BASE, vec![0; 8]).refuse_answer(&pointer.to_le_bytes());
        assert!(base(0).is_some() && base(0x1001).is_some() && base(!31).is_some());
        assert!(base(0x1000).is_none());
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
