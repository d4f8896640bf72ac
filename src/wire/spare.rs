//! Buffers that messages were written from, taken back once written, for
//! the next expanded replies to be written in.
//!
//! An expansion writes into room that is initialized first (the code is
//! safe Rust), and a buffer fresh from the allocator must be zeroed, and
//! faulted in, before anything is written: on a 16-client read of cursor
//! batches, zeroing was 6% of a tokenizing proxy's CPU time. A buffer that
//! held a message a moment ago is in the cache and its bytes are
//! initialized, so only room past them is zeroed (an expansion writes every
//! byte of its output over what was there, and the buffer is cut where the
//! output ends: nothing of the earlier message is sent). The pool is
//! bounded: at most [`KEPT`] buffers of at most [`LARGEST`] bytes each,
//! whatever the number of clients.

use parking_lot::Mutex;

use bytes::Bytes;

/// How many buffers are kept, at most.
pub const KEPT: usize = 8;
/// The largest buffer kept (a larger one goes back to the allocator):
/// what the idle buffers hold stays under 8 MiB.
pub const LARGEST: usize = 1 << 20;
/// Below this, a buffer is not worth keeping, nor a message worth a kept one.
pub const SMALLEST: usize = 4 << 10;

static POOL: Spares = Spares::new();

/// The process's pool.
pub fn pool() -> &'static Spares {
    &POOL
}

/// A buffer to write about `want` bytes in (see [`Spares::take`]).
pub fn take(want: usize) -> Vec<u8> {
    POOL.take(want)
}

/// Keeps the buffer of a message written out (see [`Spares::give`]).
pub fn give(bytes: Bytes) {
    POOL.give(bytes)
}

/// A bounded pool of buffers, each as long as its initialized bytes.
pub struct Spares(Mutex<Vec<Vec<u8>>>);

impl Spares {
    pub const fn new() -> Spares {
        Spares(parking_lot::const_mutex(Vec::new()))
    }

    /// A buffer to write about `want` bytes in: a kept one, or a new one.
    /// Its length is how many of its bytes are initialized, whatever they
    /// hold.
    ///
    /// The kept one is the shortest that holds `want`, unless it is more
    /// than twice as long: then the longest that does not (or a new one,
    /// if none is shorter). A message written into a buffer cuts it where
    /// the message ends, and the initialized bytes past that are lost: a
    /// cursor's first batch written into the buffer its last `getMore` was
    /// written from would leave the next `getMore` to zero all of it again
    /// (106 KB, and a little more, for every cursor read of the benchmark's
    /// 1,000 documents), where a buffer of the first batch's own size needs
    /// a few KB more zeroed, or none.
    pub fn take(&self, want: usize) -> Vec<u8> {
        if want < SMALLEST {
            return Vec::new();
        }
        let mut pool = self.0.lock();
        let len = |i: &usize| pool[*i].len();
        let holds = (0..pool.len()).filter(|i| len(i) >= want).min_by_key(len);
        let pick = match holds {
            Some(h) if len(&h) / 2 <= want => Some(h),
            _ => (0..pool.len()).filter(|i| len(i) < want).max_by_key(len),
        };
        match pick {
            Some(i) => pool.swap_remove(i),
            None => Vec::new(),
        }
    }

    /// Keeps the buffer of a message written out, if nothing else holds it
    /// and it is worth keeping; when the pool is full, it takes the place of
    /// the shortest kept one if it is longer.
    pub fn give(&self, bytes: Bytes) {
        if !(SMALLEST..=LARGEST).contains(&bytes.len()) {
            return;
        }
        let Ok(owned) = bytes.try_into_mut() else {
            return;
        };
        if owned.capacity() > LARGEST {
            return;
        }
        let buf = Vec::from(owned);
        let mut pool = self.0.lock();
        if pool.len() < KEPT {
            pool.push(buf);
            return;
        }
        let shortest = pool.iter_mut().min_by_key(|b| b.len());
        if let Some(kept) = shortest.filter(|b| b.len() < buf.len()) {
            *kept = buf;
        }
    }
}

impl Default for Spares {
    fn default() -> Spares {
        Spares::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: usize) -> Bytes {
        Bytes::from(vec![7u8; len])
    }

    /// A buffer comes back as long as the message it carried, its bytes
    /// those of the message; the one taken is the shortest that holds what
    /// is wanted, else the longest.
    #[test]
    fn a_written_buffer_is_taken_again() {
        let pool = Spares::new();
        assert!(pool.take(10_000).is_empty(), "nothing kept yet");
        for len in [8_000, 20_000, 50_000] {
            pool.give(message(len));
        }
        assert_eq!(pool.take(10_000).len(), 20_000);
        assert_eq!(pool.take(100_000).len(), 50_000);
        let last = pool.take(5_000);
        assert_eq!(last, vec![7u8; 8_000]);
        assert!(pool.take(5_000).is_empty(), "all taken");
        // Small wants take none.
        pool.give(message(8_000));
        assert!(pool.take(100).is_empty());
        assert_eq!(pool.take(4_096).len(), 8_000);
    }

    /// A short message is not written into a buffer more than twice its
    /// length: a cursor's first batch and its `getMore`, in turns, each
    /// take the buffer the last of their kind was written from.
    #[test]
    fn a_short_message_leaves_a_long_buffer_to_a_long_one() {
        let pool = Spares::new();
        pool.give(message(80_000));
        assert!(pool.take(10_600).is_empty(), "a new one, none shorter kept");
        pool.give(message(9_500));
        assert_eq!(pool.take(10_600).len(), 9_500, "the longest shorter one");
        assert_eq!(pool.take(90_000).len(), 80_000);
        // Within twice `want`, the shortest that holds it.
        pool.give(message(30_000));
        pool.give(message(9_500));
        assert_eq!(pool.take(15_000).len(), 30_000);
        assert_eq!(pool.take(4_750).len(), 9_500);
    }

    /// What is not kept: a message too small or too large, bytes another
    /// holder still reads, and more than `KEPT` buffers (the shortest give
    /// way to longer ones).
    #[test]
    fn the_pool_is_bounded() {
        let pool = Spares::new();
        pool.give(message(SMALLEST - 1));
        pool.give(message(LARGEST + 1));
        let shared = message(10_000);
        let other = shared.clone();
        pool.give(shared);
        assert!(pool.take(SMALLEST).is_empty());
        drop(other);
        for i in 0..KEPT + 4 {
            pool.give(message(SMALLEST + i * 1000));
        }
        // Each take of more than any holds takes the longest left.
        let mut lens: Vec<usize> = std::iter::from_fn(|| Some(pool.take(LARGEST).len()))
            .take_while(|&n| n > 0)
            .collect();
        lens.sort_unstable();
        let expected: Vec<usize> = (4..KEPT + 4).map(|i| SMALLEST + i * 1000).collect();
        assert_eq!(lens, expected);
    }
}
