//! Chunking: how large WRITE/READ descriptors are cut into pieces so that a
//! latency-sensitive descriptor waits for at most one piece.

use crate::descriptor::Opcode;
use crate::error::ConfigError;

/// Splits splittable descriptors ([`Opcode::is_splittable`]) into chunks of
/// at most `chunk_bytes`; others stay whole.
///
/// ```
/// use mtrdma_sched::{ChunkPolicy, Opcode};
/// let policy = ChunkPolicy::new(64 << 10).unwrap();
/// let pieces: Vec<_> = policy.split(Opcode::Write, 150 << 10).collect();
/// assert_eq!(pieces.len(), 3);
/// assert_eq!((pieces[2].offset, pieces[2].len, pieces[2].is_last), (128 << 10, 22 << 10, true));
/// // A SEND is never split.
/// assert_eq!(policy.split(Opcode::Send, 150 << 10).count(), 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkPolicy {
    chunk_bytes: u64,
}

impl ChunkPolicy {
    /// Chunks of at most `chunk_bytes`.
    ///
    /// # Errors
    /// [`ConfigError::ZeroChunk`] if `chunk_bytes` is 0.
    pub fn new(chunk_bytes: u64) -> Result<ChunkPolicy, ConfigError> {
        if chunk_bytes == 0 {
            return Err(ConfigError::ZeroChunk);
        }
        Ok(ChunkPolicy { chunk_bytes })
    }

    /// The chunk size.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// Length of the next piece of a descriptor of kind `op` that has
    /// `remaining` bytes left to grant.
    #[inline]
    pub fn next_len(&self, op: Opcode, remaining: u64) -> u64 {
        if op.is_splittable() {
            remaining.min(self.chunk_bytes)
        } else {
            remaining
        }
    }

    /// All pieces of a descriptor of kind `op` and `bytes` bytes, in order.
    /// A zero-byte descriptor is one zero-byte piece.
    pub fn split(&self, op: Opcode, bytes: u64) -> Chunks {
        Chunks {
            policy: *self,
            op,
            bytes,
            offset: 0,
            done: false,
        }
    }
}

/// One piece of a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Chunk {
    /// Byte offset within the descriptor.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Whether it is the last piece.
    pub is_last: bool,
}

/// Iterator over the pieces of one descriptor, from [`ChunkPolicy::split`].
#[derive(Debug, Clone)]
pub struct Chunks {
    policy: ChunkPolicy,
    op: Opcode,
    bytes: u64,
    offset: u64,
    done: bool,
}

impl Iterator for Chunks {
    type Item = Chunk;

    fn next(&mut self) -> Option<Chunk> {
        if self.done {
            return None;
        }
        let len = self.policy.next_len(self.op, self.bytes - self.offset);
        let chunk = Chunk {
            offset: self.offset,
            len,
            is_last: self.offset + len == self.bytes,
        };
        self.offset += len;
        self.done = chunk.is_last;
        Some(chunk)
    }
}
