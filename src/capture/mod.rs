//! Capture of wire sessions (replayed by [`crate::tools::replay`]).
//!
//! A capture file holds one downstream session: every request as the driver
//! sent it and every reply as the driver received it, decompressed, each with
//! a timestamp. The format is documented in `proto/README.md`:
//!
//! ```text
//! file   := magic record*
//! magic  := "LCAP" 0x00 0x01 0x00 0x00          (format version 1)
//! record := direction:u8 timestamp_us:u64le frame
//! direction := 0 (request, driver → proxy) | 1 (reply, proxy → driver)
//! frame  := one complete wire message, its own header giving its length
//! ```

pub mod diff;

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::wire::{Frame, Header, MAX_MESSAGE_SIZE};

/// The first eight bytes of every capture file.
pub const MAGIC: [u8; 8] = *b"LCAP\x00\x01\x00\x00";

/// Which way a recorded frame travelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Request = 0,
    Reply = 1,
}

/// One recorded frame.
#[derive(Clone, Debug)]
pub struct Record {
    pub direction: Direction,
    /// Microseconds since the Unix epoch.
    pub timestamp_us: u64,
    pub frame: Frame,
}

/// The directory sessions are captured into.
#[derive(Clone, Debug)]
pub struct CaptureDir {
    dir: PathBuf,
}

impl CaptureDir {
    pub fn create(dir: &Path) -> std::io::Result<CaptureDir> {
        std::fs::create_dir_all(dir)?;
        Ok(CaptureDir {
            dir: dir.to_owned(),
        })
    }

    /// Opens `<dir>/<unix ms>-<session>.lcap` for one session.
    pub fn open_session(&self, session: u64, peer: SocketAddr) -> std::io::Result<CaptureWriter> {
        let ms = now_us() / 1000;
        let path = self.dir.join(format!("{ms}-{session:06}.lcap"));
        let mut out = BufWriter::new(File::create(&path)?);
        out.write_all(&MAGIC)?;
        out.flush()?;
        tracing::debug!(session, client.addr = %peer, path = %path.display(), "capturing session");
        Ok(CaptureWriter { out, path })
    }
}

/// Appends one session's records. Each record is flushed as it is written, so
/// a capture survives the proxy being killed.
#[derive(Debug)]
pub struct CaptureWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl CaptureWriter {
    pub fn record(&mut self, direction: Direction, frame: &Frame) {
        let bytes = frame.to_bytes();
        let result = (|| {
            self.out.write_all(&[direction as u8])?;
            self.out.write_all(&now_us().to_le_bytes())?;
            self.out.write_all(&bytes)?;
            self.out.flush()
        })();
        if let Err(e) = result {
            tracing::warn!(path = %self.path.display(), error = %e, "capture write failed");
        }
    }
}

/// Errors reading a capture file.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a Laconic capture (bad magic)")]
    BadMagic { path: PathBuf },
    #[error("{path}: record {index}: {reason}")]
    BadRecord {
        path: PathBuf,
        index: usize,
        reason: String,
    },
}

/// Reads every record of a capture file.
pub fn read_capture(path: &Path) -> Result<Vec<Record>, CaptureError> {
    let mut data = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .map_err(|source| CaptureError::Io {
            path: path.to_owned(),
            source,
        })?;
    parse_capture(&data).map_err(|(index, reason)| match index {
        None => CaptureError::BadMagic {
            path: path.to_owned(),
        },
        Some(index) => CaptureError::BadRecord {
            path: path.to_owned(),
            index,
            reason,
        },
    })
}

/// Parses capture bytes; errors carry the record index (`None`: bad magic).
pub fn parse_capture(data: &[u8]) -> Result<Vec<Record>, (Option<usize>, String)> {
    if data.len() < MAGIC.len() || data[..MAGIC.len()] != MAGIC {
        return Err((None, "bad magic".into()));
    }
    let mut pos = MAGIC.len();
    let mut records = Vec::new();
    while pos < data.len() {
        let index = records.len();
        let bad = |reason: String| (Some(index), reason);
        if data.len() - pos < 9 + 16 {
            return Err(bad("truncated record".into()));
        }
        let direction = match data[pos] {
            0 => Direction::Request,
            1 => Direction::Reply,
            d => return Err(bad(format!("unknown direction {d}"))),
        };
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&data[pos + 1..pos + 9]);
        pos += 9;
        let header = Header::parse(&data[pos..]).map_err(|e| bad(e.to_string()))?;
        let len = Header::check_length(header.length, MAX_MESSAGE_SIZE)
            .map_err(|e| bad(e.to_string()))?;
        if data.len() - pos < len {
            return Err(bad("truncated frame".into()));
        }
        let frame = Frame::parse(
            Bytes::copy_from_slice(&data[pos..pos + len]),
            MAX_MESSAGE_SIZE,
        )
        .map_err(|e| bad(e.to_string()))?;
        pos += len;
        records.push(Record {
            direction,
            timestamp_us: u64::from_le_bytes(ts),
            frame,
        });
    }
    Ok(records)
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
