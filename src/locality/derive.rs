//! A Locality UUID derived from an ObjectId, deterministically and reversibly,
//! so that any number of proxies agree without a lookup table.
//!
//! An ObjectId is `seconds:4 | process-unique:5 | counter:3`. Each part lands
//! in the UUID field of the same meaning:
//!
//! ```text
//! timestamp (ms)  = seconds × 1000
//! process id      = process-unique bytes 0–1
//! MAC (28 bits)   = marker nibble | process-unique bytes 2–4
//! counter         = ObjectId counter            (default mode, written nibble-reversed)
//!                 = window seed + ObjectId counter (sequential mode, big-endian)
//! ```
//!
//! The marker nibble (0x8 default, 0x9 sequential) says which mode derived it.

use super::{window_seed, Fields, Mode};

const MARK_DEFAULT: u32 = 0x8;
const MARK_SEQUENTIAL: u32 = 0x9;

/// The Locality UUID that stands for `oid`.
pub fn from_object_id(oid: &[u8; 12], mode: Mode) -> [u8; 16] {
    let seconds = u32::from_be_bytes([oid[0], oid[1], oid[2], oid[3]]);
    let millis = u64::from(seconds) * 1000;
    let counter = u32::from_be_bytes([0, oid[9], oid[10], oid[11]]);
    let mark = match mode {
        Mode::Default => MARK_DEFAULT,
        Mode::Sequential => MARK_SEQUENTIAL,
    };
    Fields {
        counter: match mode {
            Mode::Default => counter,
            Mode::Sequential => window_seed(millis).wrapping_add(counter),
        },
        process: u16::from_be_bytes([oid[4], oid[5]]),
        mac: (mark << 24) | u32::from_be_bytes([0, oid[6], oid[7], oid[8]]),
        millis,
    }
    .encode(mode)
}

/// The ObjectId a derived UUID stands for; `None` if `uuid` was not derived
/// by [`from_object_id`].
pub fn to_object_id(uuid: &[u8; 16]) -> Option<[u8; 12]> {
    let mode = match u32::from(uuid[6] & 0x0F) {
        MARK_DEFAULT => Mode::Default,
        MARK_SEQUENTIAL => Mode::Sequential,
        _ => return None,
    };
    let f = Fields::decode(uuid, mode)?;
    if f.millis % 1000 != 0 || f.millis / 1000 > u64::from(u32::MAX) {
        return None;
    }
    let counter = match mode {
        Mode::Default => f.counter,
        Mode::Sequential => f.counter.wrapping_sub(window_seed(f.millis)),
    };
    if counter > 0x00FF_FFFF {
        return None;
    }
    let mut oid = [0u8; 12];
    oid[0..4].copy_from_slice(&((f.millis / 1000) as u32).to_be_bytes());
    oid[4..6].copy_from_slice(&f.process.to_be_bytes());
    oid[6..9].copy_from_slice(&f.mac.to_be_bytes()[1..4]);
    oid[9..12].copy_from_slice(&counter.to_be_bytes()[1..4]);
    Some(oid)
}
