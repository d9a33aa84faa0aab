//! The agent's wire format: one request and one response per connection, little endian.
//!
//! Request: `magic[4] "FCK1" | op u32 | timeout_ms u32 | pair_count u32 | pairs (old uuid[16],
//! new uuid[16]) * pair_count`. Response: `magic[4] "FCK1" | result u32 | value u64` (the state
//! or the thread id where the op returns one).

use std::io::{self, Read, Write};

pub(crate) const MAGIC: [u8; 4] = *b"FCK1";
/// Most GPU pairs one restore may carry.
pub(crate) const MAX_PAIRS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Lock = 1,
    Checkpoint = 2,
    Restore = 3,
    Unlock = 4,
    GetState = 5,
}

impl Op {
    fn from_u32(v: u32) -> Option<Op> {
        Some(match v {
            1 => Op::Lock,
            2 => Op::Checkpoint,
            3 => Op::Restore,
            4 => Op::Unlock,
            5 => Op::GetState,
            _ => return None,
        })
    }
}

pub(crate) type Pair = ([u8; 16], [u8; 16]);

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub op: Op,
    pub timeout_ms: u32,
    pub pairs: Vec<Pair>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Response {
    pub result: u32,
    pub value: u64,
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

impl Request {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + 32 * self.pairs.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&(self.op as u32).to_le_bytes());
        out.extend_from_slice(&self.timeout_ms.to_le_bytes());
        out.extend_from_slice(&(self.pairs.len() as u32).to_le_bytes());
        for (old, new) in &self.pairs {
            out.extend_from_slice(old);
            out.extend_from_slice(new);
        }
        out
    }

    pub(crate) fn read_from(r: &mut impl Read) -> io::Result<Request> {
        let mut head = [0u8; 16];
        r.read_exact(&mut head)?;
        let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        if head[0..4] != MAGIC {
            return Err(bad("bad magic"));
        }
        let op = Op::from_u32(word(4)).ok_or_else(|| bad("unknown op"))?;
        let count = word(12) as usize;
        if count > MAX_PAIRS {
            return Err(bad("too many gpu pairs"));
        }
        let mut pairs = Vec::with_capacity(count);
        for _ in 0..count {
            let mut raw = [0u8; 32];
            r.read_exact(&mut raw)?;
            let mut old = [0u8; 16];
            let mut new = [0u8; 16];
            old.copy_from_slice(&raw[..16]);
            new.copy_from_slice(&raw[16..]);
            pairs.push((old, new));
        }
        Ok(Request {
            op,
            timeout_ms: word(8),
            pairs,
        })
    }
}

impl Response {
    pub(crate) fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut out = [0u8; 16];
        out[0..4].copy_from_slice(&MAGIC);
        out[4..8].copy_from_slice(&self.result.to_le_bytes());
        out[8..16].copy_from_slice(&self.value.to_le_bytes());
        w.write_all(&out)
    }

    pub(crate) fn read_from(r: &mut impl Read) -> io::Result<Response> {
        let mut raw = [0u8; 16];
        r.read_exact(&mut raw)?;
        if raw[0..4] != MAGIC {
            return Err(bad("bad magic"));
        }
        let mut result = [0u8; 4];
        result.copy_from_slice(&raw[4..8]);
        let mut value = [0u8; 8];
        value.copy_from_slice(&raw[8..16]);
        Ok(Response {
            result: u32::from_le_bytes(result),
            value: u64::from_le_bytes(value),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_responses_round_trip() {
        let req = Request {
            op: Op::Restore,
            timeout_ms: 1234,
            pairs: vec![([1; 16], [2; 16]), ([3; 16], [4; 16])],
        };
        let bytes = req.encode();
        assert_eq!(Request::read_from(&mut bytes.as_slice()).unwrap(), req);
        let resp = Response {
            result: 909,
            value: 77,
        };
        let mut out = Vec::new();
        resp.write_to(&mut out).unwrap();
        assert_eq!(Response::read_from(&mut out.as_slice()).unwrap(), resp);
    }

    #[test]
    fn malformed_requests_are_refused() {
        let mut bytes = Request {
            op: Op::Lock,
            timeout_ms: 0,
            pairs: Vec::new(),
        }
        .encode();
        bytes[4] = 99;
        assert!(Request::read_from(&mut bytes.as_slice()).is_err());
        let mut many = Request {
            op: Op::Restore,
            timeout_ms: 0,
            pairs: Vec::new(),
        }
        .encode();
        many[12] = 200;
        assert!(Request::read_from(&mut many.as_slice()).is_err());
        assert!(Request::read_from(&mut &b"FCK1"[..]).is_err());
    }
}
