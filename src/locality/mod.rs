//! Locality UUIDs (Groupon's layout): ids whose leading bytes spread writes
//! across a range-sharded cluster, or cluster them in time on purpose, and
//! whose embedded fields can be read back.
//!
//! ```text
//!  wwwwwwww-xxxx-byyy-yyyy-zzzzzzzzzzzz
//!  bytes 0–3   counter: nibble-reversed (default mode) or big-endian (sequential)
//!  bytes 4–5   process id mod 65,536 (or a configured node id)
//!  byte 6      high nibble: the literal 0xB; low nibble + bytes 7–9: the last 28 bits of a MAC
//!  bytes 10–15 UTC milliseconds since the epoch
//! ```
//!
//! **Default mode.** The counter starts at a random value and advances by the
//! odd constant [`INCREMENT`], wrapping mod 2³²: an odd step visits all 2³²
//! values before repeating. It is written nibble-reversed, lowest nibble
//! first, so consecutive ids differ in their first hex digit.
//!
//! **Sequential mode.** The counter starts from the MD5 digest of the current
//! UTC 10-minute window (`yyyyMMddHHm`, bytes 0–3 little-endian) and advances
//! by one, written big-endian: ids made in the same window on different
//! machines share a highly variable prefix, then increase.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use md5::{Digest, Md5};

/// The odd step of the default-mode counter.
pub const INCREMENT: u32 = 198_491_317;

/// The version nibble.
pub const VERSION: u8 = 0xB;

/// Which counter layout an id uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Nibble-reversed counter advanced by [`INCREMENT`]: spreads writes.
    Default,
    /// Counter from the hash of the 10-minute window, advanced by one: clusters writes in time.
    Sequential,
}

/// The fields of a Locality UUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fields {
    pub counter: u32,
    pub process: u16,
    /// The low 28 bits of the MAC address.
    pub mac: u32,
    /// UTC milliseconds since the epoch (48 bits).
    pub millis: u64,
}

impl Fields {
    /// Lays the fields out as 16 bytes, writing the counter as `mode` says.
    pub fn encode(&self, mode: Mode) -> [u8; 16] {
        let mut b = [0u8; 16];
        let counter = match mode {
            Mode::Default => reverse_nibbles(self.counter),
            Mode::Sequential => self.counter,
        };
        b[0..4].copy_from_slice(&counter.to_be_bytes());
        b[4..6].copy_from_slice(&self.process.to_be_bytes());
        let mac = self.mac & 0x0FFF_FFFF;
        b[6] = (VERSION << 4) | (mac >> 24) as u8;
        b[7] = (mac >> 16) as u8;
        b[8] = (mac >> 8) as u8;
        b[9] = mac as u8;
        b[10..16].copy_from_slice(&self.millis.to_be_bytes()[2..8]);
        b
    }

    /// Reads the fields back; `None` if the version nibble is not 0xB.
    pub fn decode(b: &[u8; 16], mode: Mode) -> Option<Fields> {
        if b[6] >> 4 != VERSION {
            return None;
        }
        let raw = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let mut ms = [0u8; 8];
        ms[2..8].copy_from_slice(&b[10..16]);
        Some(Fields {
            counter: match mode {
                Mode::Default => reverse_nibbles(raw),
                Mode::Sequential => raw,
            },
            process: u16::from_be_bytes([b[4], b[5]]),
            mac: (u32::from(b[6] & 0x0F) << 24)
                | (u32::from(b[7]) << 16)
                | (u32::from(b[8]) << 8)
                | u32::from(b[9]),
            millis: u64::from_be_bytes(ms),
        })
    }
}

/// Reverses the order of the eight nibbles of `v` (its hex digits).
pub fn reverse_nibbles(v: u32) -> u32 {
    let mut out = 0u32;
    for i in 0..8 {
        out |= ((v >> (4 * i)) & 0xF) << (4 * (7 - i));
    }
    out
}

/// The sequential-mode starting counter for the 10-minute window holding `millis`.
pub fn window_seed(millis: u64) -> u32 {
    let (y, mo, d, h, mi, _, _, _) = civil(millis);
    let key = format!("{y:04}{mo:02}{d:02}{h:02}{}", mi / 10);
    let digest = Md5::digest(key.as_bytes());
    u32::from_le_bytes([digest[0], digest[1], digest[2], digest[3]])
}

fn window_of(millis: u64) -> u64 {
    millis / 600_000
}

/// Formats 16 bytes as `8-4-4-4-12` lowercase hex.
pub fn format(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Parses `8-4-4-4-12` hex (dashes optional).
pub fn parse(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || !hex.is_ascii() {
        return None;
    }
    let mut b = [0u8; 16];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(b)
}

/// A thread-safe generator of Locality UUIDs.
#[derive(Debug)]
pub struct Generator {
    mode: Mode,
    process: u16,
    mac: u32,
    /// Default mode: the counter, advanced atomically.
    counter: AtomicU32,
    /// Sequential mode: (window, next counter), reset when the window changes.
    sequential: Mutex<(u64, u32)>,
}

impl Generator {
    /// A generator for this process and machine.
    pub fn new(mode: Mode) -> Generator {
        Generator::with_identity(mode, (std::process::id() % 65_536) as u16, machine_mac())
    }

    /// A generator whose process-id and MAC fields come from a node id, for
    /// containers where every process is pid 1 and MACs are synthetic. The
    /// node id's low 16 bits fill the process field and its next 28 bits the MAC field.
    pub fn with_node_id(mode: Mode, node_id: u64) -> Generator {
        Generator::with_identity(mode, node_id as u16, ((node_id >> 16) & 0x0FFF_FFFF) as u32)
    }

    pub fn with_identity(mode: Mode, process: u16, mac: u32) -> Generator {
        Generator {
            mode,
            process,
            mac: mac & 0x0FFF_FFFF,
            counter: AtomicU32::new(crate::random::u64() as u32),
            sequential: Mutex::new((u64::MAX, 0)),
        }
    }

    /// The next id.
    pub fn next(&self) -> [u8; 16] {
        let millis = now_millis();
        self.at(millis)
    }

    /// The next id with the timestamp `millis` (for tests and simulations).
    pub fn at(&self, millis: u64) -> [u8; 16] {
        let counter = match self.mode {
            Mode::Default => self
                .counter
                .fetch_add(INCREMENT, Ordering::Relaxed)
                .wrapping_add(INCREMENT),
            Mode::Sequential => {
                let mut s = self.sequential.lock();
                let w = window_of(millis);
                if s.0 != w {
                    *s = (w, window_seed(millis));
                }
                let c = s.1;
                s.1 = s.1.wrapping_add(1);
                c
            }
        };
        Fields {
            counter,
            process: self.process,
            mac: self.mac,
            millis,
        }
        .encode(self.mode)
    }
}

/// The seed's decoder output.
pub fn describe(b: &[u8; 16], mode: Mode) -> Option<String> {
    let f = Fields::decode(b, mode)?;
    let mac = format!(
        "__:__:_{:x}:{:02x}:{:02x}:{:02x}",
        (f.mac >> 24) & 0xF,
        (f.mac >> 16) & 0xFF,
        (f.mac >> 8) & 0xFF,
        f.mac & 0xFF
    );
    Some(format!(
        "counter     : {}\nprocess id  : {}\nMAC address : {mac}\ntimestamp   : {} ({})",
        thousands(u64::from(f.counter)),
        thousands(u64::from(f.process)),
        thousands(f.millis),
        http_date(f.millis)
    ))
}

fn thousands(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `Mon, 15 Oct 2012 18:58:18.450 UTC`
pub fn http_date(millis: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (y, mo, d, h, mi, s, ms, weekday) = civil(millis);
    format!(
        "{}, {d:02} {} {y} {h:02}:{mi:02}:{s:02}.{ms:03} UTC",
        DAYS[weekday as usize],
        MONTHS[(mo - 1) as usize]
    )
}

/// (year, month, day, hour, minute, second, millisecond, days since a Thursday mod 7)
fn civil(millis: u64) -> (i64, u32, u32, u32, u32, u32, u32, u32) {
    let days = (millis / 86_400_000) as i64;
    let rem = millis % 86_400_000;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m,
        d,
        (rem / 3_600_000) as u32,
        (rem / 60_000 % 60) as u32,
        (rem / 1000 % 60) as u32,
        (rem % 1000) as u32,
        (days % 7) as u32,
    )
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The low 28 bits of the first non-zero MAC address in /sys/class/net, or
/// bits derived from the host name where there is none.
fn machine_mac() -> u32 {
    let from_sys = std::fs::read_dir("/sys/class/net").ok().and_then(|dir| {
        let mut names: Vec<_> = dir.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        names.sort();
        names.into_iter().find_map(|p| {
            let text = std::fs::read_to_string(p.join("address")).ok()?;
            let bytes: Vec<u8> = text
                .trim()
                .split(':')
                .filter_map(|h| u8::from_str_radix(h, 16).ok())
                .collect();
            (bytes.len() == 6 && bytes.iter().any(|&b| b != 0)).then(|| {
                (u32::from(bytes[2] & 0x0F) << 24)
                    | (u32::from(bytes[3]) << 16)
                    | (u32::from(bytes[4]) << 8)
                    | u32::from(bytes[5])
            })
        })
    });
    from_sys.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        let d = Md5::digest(host.trim().as_bytes());
        u32::from_be_bytes([d[0], d[1], d[2], d[3]]) & 0x0FFF_FFFF
    })
}

mod derive;
pub mod simulate;
pub use derive::{from_object_id, to_object_id};

#[cfg(test)]
mod tests;
