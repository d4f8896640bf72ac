//! A bounds-checked cursor over a byte slice: every read says what it was
//! reading when the input runs out, and nothing here can panic.

use super::WireError;

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        if n > self.remaining() {
            return Err(WireError::Truncated(what));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.take(1, what)?[0])
    }

    pub(crate) fn i32(&mut self, what: &'static str) -> Result<i32, WireError> {
        let b = self.take(4, what)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        Ok(self.i32(what)? as u32)
    }

    pub(crate) fn i64(&mut self, what: &'static str) -> Result<i64, WireError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_le_bytes(a))
    }

    /// A NUL-terminated string, returned without its terminator.
    pub(crate) fn cstring(&mut self, what: &'static str) -> Result<&'a str, WireError> {
        let rest = &self.buf[self.pos..];
        let end = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(WireError::Truncated(what))?;
        let s = std::str::from_utf8(&rest[..end]).map_err(|_| WireError::InvalidCString(what))?;
        self.pos += end + 1;
        Ok(s)
    }

    /// One BSON document: its int32 length is checked against what is left
    /// before anything is sliced, and it must end with a NUL byte.
    pub(crate) fn document(&mut self, what: &'static str) -> Result<(usize, usize), WireError> {
        let start = self.pos;
        let len = self.i32(what)?;
        let len = usize::try_from(len).map_err(|_| WireError::InvalidDocument(what))?;
        if len < 5 || len - 4 > self.remaining() {
            return Err(WireError::InvalidDocument(what));
        }
        self.pos = start + len;
        if self.buf[self.pos - 1] != 0 {
            return Err(WireError::InvalidDocument(what));
        }
        Ok((start, self.pos))
    }
}
