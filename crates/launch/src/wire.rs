//! The rendezvous protocol's framing: every message is a 12-byte header (magic `PSIM`,
//! protocol version u16, kind u8, a zero byte, payload length u32, little-endian) and its
//! payload. A peer of another program (wrong magic) or another parsim (wrong version) is
//! refused with a message saying which.

use super::unique_id::{IdSource, ID_BYTES};
use std::io::{Read, Write};

pub const MAGIC: [u8; 4] = *b"PSIM";
pub const VERSION: u16 = 1;
/// Largest payload accepted (a report is a few kB; this bounds memory on garbage).
pub const MAX_PAYLOAD_BYTES: u32 = 64 << 20;
const HEADER_BYTES: usize = 12;

/// One message of the protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A worker introduces itself to rank 0.
    Hello { rank: u32, world_size: u32 },
    /// Rank 0's id for every rank.
    Id {
        id: [u8; ID_BYTES],
        source: IdSource,
    },
    /// A worker's report (JSON of a `RunReport`).
    Report { rank: u32, json: String },
    /// A worker's own work failed.
    Failed { rank: u32, message: String },
    /// Rank 0 tells a worker to stop: the rendezvous or another rank failed.
    Stop { message: String },
}

/// Why a message could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Protocol(String),
}

impl Message {
    fn kind(&self) -> u8 {
        match self {
            Message::Hello { .. } => 1,
            Message::Id { .. } => 2,
            Message::Report { .. } => 3,
            Message::Failed { .. } => 4,
            Message::Stop { .. } => 5,
        }
    }

    fn payload(&self) -> Vec<u8> {
        let mut p = Vec::new();
        match self {
            Message::Hello { rank, world_size } => {
                p.extend(rank.to_le_bytes());
                p.extend(world_size.to_le_bytes());
            }
            Message::Id { id, source } => {
                p.extend_from_slice(id);
                p.push(match source {
                    IdSource::Nccl => 1,
                    IdSource::StandIn => 0,
                });
            }
            Message::Report { rank, json: text }
            | Message::Failed {
                rank,
                message: text,
            } => {
                p.extend(rank.to_le_bytes());
                p.extend(text.as_bytes());
            }
            Message::Stop { message } => p.extend(message.as_bytes()),
        }
        p
    }

    /// The framed bytes.
    pub fn encode(&self) -> Vec<u8> {
        let payload = self.payload();
        let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
        out.extend(MAGIC);
        out.extend(VERSION.to_le_bytes());
        out.push(self.kind());
        out.push(0);
        out.extend((payload.len() as u32).to_le_bytes());
        out.extend(payload);
        out
    }

    /// Writes one message.
    pub fn write_to(&self, w: &mut impl Write) -> Result<(), WireError> {
        let bytes = self.encode();
        if bytes.len() - HEADER_BYTES > MAX_PAYLOAD_BYTES as usize {
            return Err(WireError::Protocol(format!(
                "a message of {} bytes exceeds the limit of {MAX_PAYLOAD_BYTES}",
                bytes.len()
            )));
        }
        w.write_all(&bytes)?;
        w.flush()?;
        Ok(())
    }

    /// Reads one message (the stream's timeouts bound the wait).
    pub fn read_from(r: &mut impl Read) -> Result<Message, WireError> {
        let mut h = [0u8; HEADER_BYTES];
        r.read_exact(&mut h)?;
        if h[0..4] != MAGIC {
            return Err(WireError::Protocol(format!(
                "not a parsim peer (magic {:02x?}, expected \"PSIM\")",
                &h[0..4]
            )));
        }
        let version = u16::from_le_bytes([h[4], h[5]]);
        if version != VERSION {
            return Err(WireError::Protocol(format!(
                "peer speaks protocol version {version}, this parsim speaks {VERSION} (mixed parsim builds?)"
            )));
        }
        let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
        if len > MAX_PAYLOAD_BYTES {
            return Err(WireError::Protocol(format!(
                "a payload of {len} bytes exceeds the limit of {MAX_PAYLOAD_BYTES}"
            )));
        }
        let mut p = vec![0u8; len as usize];
        r.read_exact(&mut p)?;
        Self::decode(h[6], &p)
    }

    fn decode(kind: u8, p: &[u8]) -> Result<Message, WireError> {
        let short = |what: &str| {
            WireError::Protocol(format!(
                "a {what} message of {} bytes is malformed",
                p.len()
            ))
        };
        let u32_at = |i: usize| -> Option<u32> {
            p.get(i..i + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let text = |what: &str| String::from_utf8(p[4..].to_vec()).map_err(|_| short(what));
        match kind {
            1 if p.len() == 8 => Ok(Message::Hello {
                rank: u32_at(0).ok_or_else(|| short("hello"))?,
                world_size: u32_at(4).ok_or_else(|| short("hello"))?,
            }),
            2 if p.len() == ID_BYTES + 1 => {
                let mut id = [0u8; ID_BYTES];
                id.copy_from_slice(&p[..ID_BYTES]);
                let source = match p[ID_BYTES] {
                    1 => IdSource::Nccl,
                    0 => IdSource::StandIn,
                    _ => return Err(short("id")),
                };
                Ok(Message::Id { id, source })
            }
            3 if p.len() >= 4 => Ok(Message::Report {
                rank: u32_at(0).ok_or_else(|| short("report"))?,
                json: text("report")?,
            }),
            4 if p.len() >= 4 => Ok(Message::Failed {
                rank: u32_at(0).ok_or_else(|| short("failure"))?,
                message: text("failure")?,
            }),
            5 => Ok(Message::Stop {
                message: String::from_utf8(p.to_vec()).map_err(|_| short("stop"))?,
            }),
            1..=4 => Err(short(
                ["hello", "id", "report", "failure"][kind as usize - 1],
            )),
            k => Err(WireError::Protocol(format!("unknown message kind {k}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(m: Message) {
        let bytes = m.encode();
        assert_eq!(&bytes[..4], b"PSIM");
        let len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
        assert_eq!(len, bytes.len() - 12, "length field counts the payload");
        assert_eq!(Message::read_from(&mut bytes.as_slice()).unwrap(), m);
    }

    #[test]
    fn every_message_round_trips() {
        let mut id = [0u8; ID_BYTES];
        id.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8 ^ 0x5a);
        roundtrip(Message::Hello {
            rank: 3,
            world_size: 4,
        });
        roundtrip(Message::Id {
            id,
            source: IdSource::Nccl,
        });
        roundtrip(Message::Id {
            id,
            source: IdSource::StandIn,
        });
        roundtrip(Message::Report {
            rank: 2,
            json: "{\"world\":4}".into(),
        });
        roundtrip(Message::Failed {
            rank: 1,
            message: "out of memory: ü".into(),
        });
        roundtrip(Message::Stop {
            message: String::new(),
        });
    }

    #[test]
    fn hello_layout_is_little_endian() {
        let b = Message::Hello {
            rank: 0x0102_0304,
            world_size: 7,
        }
        .encode();
        assert_eq!(
            b,
            [b'P', b'S', b'I', b'M', 1, 0, 1, 0, 8, 0, 0, 0, 4, 3, 2, 1, 7, 0, 0, 0]
        );
    }

    #[test]
    fn messages_follow_each_other_on_one_stream() {
        let mut s = Message::Hello {
            rank: 1,
            world_size: 2,
        }
        .encode();
        s.extend(
            Message::Stop {
                message: "bye".into(),
            }
            .encode(),
        );
        let mut r = s.as_slice();
        assert!(matches!(
            Message::read_from(&mut r).unwrap(),
            Message::Hello { rank: 1, .. }
        ));
        assert!(matches!(
            Message::read_from(&mut r).unwrap(),
            Message::Stop { .. }
        ));
        assert!(
            matches!(Message::read_from(&mut r), Err(WireError::Io(_))),
            "end of stream"
        );
    }

    #[test]
    fn a_wrong_peer_is_refused_with_a_reason() {
        let err = |bytes: Vec<u8>| match Message::read_from(&mut bytes.as_slice()) {
            Err(WireError::Protocol(m)) => m,
            other => panic!("{other:?}"),
        };
        // Another program (an HTTP client on the port).
        assert!(err(b"GET / HTTP/1.1\r\n".to_vec()).contains("not a parsim peer"));
        // Another protocol version.
        let mut v2 = Message::Hello {
            rank: 1,
            world_size: 2,
        }
        .encode();
        v2[4] = 2;
        assert!(err(v2).contains("version 2"));
        // An unknown kind, a truncated hello, an oversized length, a bad id source.
        let mut k = Message::Stop {
            message: String::new(),
        }
        .encode();
        k[6] = 9;
        assert!(err(k).contains("unknown message kind 9"));
        let mut short = Message::Hello {
            rank: 1,
            world_size: 2,
        }
        .encode();
        short[8] = 4;
        short.truncate(16);
        assert!(err(short).contains("hello message of 4 bytes"));
        let mut big = Message::Stop {
            message: String::new(),
        }
        .encode();
        big[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(err(big).contains("exceeds the limit"));
        let mut src = Message::Id {
            id: [0; ID_BYTES],
            source: IdSource::Nccl,
        }
        .encode();
        *src.last_mut().unwrap() = 7;
        assert!(err(src).contains("id message"));
    }

    #[test]
    fn a_truncated_payload_is_an_io_error() {
        let mut b = Message::Report {
            rank: 0,
            json: "abcdef".into(),
        }
        .encode();
        b.truncate(b.len() - 2);
        assert!(matches!(
            Message::read_from(&mut b.as_slice()),
            Err(WireError::Io(_))
        ));
    }
}
