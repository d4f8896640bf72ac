//! A memory budget shared by all sessions: shares of it are taken before
//! the memory is, and given back when dropped. Heavy work
//! ([`crate::exchange::HeavyWork`], `proxy.max_work_bytes`) and the
//! messages being read from drivers (`proxy.max_read_bytes`) each have one.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes that may be held at once, counted in KiB.
#[derive(Clone, Debug)]
pub struct Budget {
    kib: Arc<Semaphore>,
    most_kib: usize,
}

/// Part of a [`Budget`], held until dropped.
#[derive(Debug)]
pub struct Share {
    held: OwnedSemaphorePermit,
}

impl Budget {
    pub fn new(max_bytes: usize) -> Budget {
        let most_kib = max_bytes.div_ceil(1024).min(Semaphore::MAX_PERMITS);
        Budget {
            kib: Arc::new(Semaphore::new(most_kib)),
            most_kib,
        }
    }

    /// A share of `bytes`, once the budget has room for it. A share larger
    /// than the whole budget is the whole budget: it waits for every other
    /// share to be given back, and is then held alone. (Cancellation safe:
    /// a dropped wait takes nothing.)
    pub async fn share(&self, bytes: usize) -> Share {
        let kib = permits(bytes.div_ceil(1024).min(self.most_kib));
        match Arc::clone(&self.kib).acquire_many_owned(kib).await {
            Ok(held) => Share { held },
            Err(_) => unreachable!("the budget's semaphore is never closed"),
        }
    }

    /// A share of `bytes` if the budget has room for it now; none larger
    /// than the whole budget.
    pub fn try_share(&self, bytes: usize) -> Option<Share> {
        let kib = bytes.div_ceil(1024);
        if kib > self.most_kib {
            return None;
        }
        Arc::clone(&self.kib)
            .try_acquire_many_owned(permits(kib))
            .ok()
            .map(|held| Share { held })
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        (self.most_kib - self.kib.available_permits().min(self.most_kib)) * 1024
    }
}

impl Share {
    /// Adds `other` (of the same budget) to this share.
    pub fn merge(&mut self, other: Share) {
        self.held.merge(other.held);
    }

    /// Gives back all of the share but `bytes` (nothing if it holds no
    /// more): for memory freed while the rest is still held.
    pub fn keep(&mut self, bytes: usize) {
        let keep = bytes.div_ceil(1024);
        let held = self.held.num_permits();
        if held > keep {
            drop(self.held.split(held - keep));
        }
    }
}

fn permits(kib: usize) -> u32 {
    u32::try_from(kib).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn shares_areheld_until_dropped_and_capped_at_the_budget() {
        let budget = Budget::new(4096);
        let three = budget.try_share(3072).expect("room for 3 KiB of 4");
        assert_eq!(budget.held(), 3072);
        assert!(budget.try_share(2048).is_none());
        // A wait for more than is left ends when the share is given back.
        let waiting = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.share(2048).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        drop(three);
        let two = waiting.await.unwrap();
        assert_eq!(budget.held(), 2048);
        drop(two);
        // Part of a share given back early.
        let mut three = budget.try_share(3072).unwrap();
        three.keep(1000);
        assert_eq!(budget.held(), 1024);
        three.keep(5000);
        assert_eq!(budget.held(), 1024, "a share never grows");
        drop(three);
        assert!(budget.try_share(4097).is_none(), "more than the budget");
        // Waited for, more than the budget is the whole of it.
        let all = budget.share(1 << 30).await;
        assert_eq!(budget.held(), 4096);
        drop(all);
        assert_eq!(budget.held(), 0);
    }
}
