//! Random bytes from the operating system's generator (through the bson
//! crate's version-4 UUIDs): dictionary identities, proxy cursor ids, the
//! start of Locality UUID counters.

/// 16 random bytes.
pub fn bytes() -> [u8; 16] {
    bson::Uuid::new().bytes()
}

/// A random 64-bit number.
pub fn u64() -> u64 {
    let b = bytes();
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}
