//! Heavy work: what would hold a runtime thread for long (decompressing or
//! rewriting a huge message, parsing a command into documents), done on
//! threads of its own, within a budget of the memory it holds.
//!
//! The threads are few and live as long as the proxy: the allocator keeps
//! memory a thread freed for a while before giving it back, so work spread
//! over many threads leaves the memory of each behind it. Eight clients
//! sending an aggregate of about 45 MB to rewrite at once, budgeted one at
//! a time, left the process 139 and 153 MB larger on the runtime's
//! blocking pool, and 100 MB larger on one thread of its own.

use std::num::NonZeroUsize;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::budget::Budget;
use crate::error::ProxyError;

type Job = Box<dyn FnOnce() + Send>;

/// The threads and the budget of the memory all heavy work together may
/// hold.
#[derive(Clone, Debug)]
pub struct HeavyWork {
    budget: Budget,
    jobs: mpsc::Sender<Job>,
}

impl HeavyWork {
    /// Threads for heavy work: half as many as the cores, one at least and
    /// four at most. The other half is left to the runtime's threads, which
    /// serve every other session meanwhile, and each thread keeps the memory
    /// of the largest work it did.
    pub fn threads() -> usize {
        (std::thread::available_parallelism().map_or(2, NonZeroUsize::get) / 2).clamp(1, 4)
    }

    /// Starts `threads` threads, with a budget of `max_bytes`.
    pub fn new(max_bytes: usize, threads: usize) -> std::io::Result<HeavyWork> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..threads {
            let queue = Arc::clone(&queue);
            std::thread::Builder::new()
                .name(format!("laconic-heavy-{i}"))
                .spawn(move || loop {
                    // The lock is held only while waiting for the next job.
                    let job = queue.lock().recv();
                    let Ok(job) = job else {
                        // The proxy is gone.
                        return;
                    };
                    // A panic ends the job (its caller gets an internal
                    // error), not the thread.
                    let _ = catch_unwind(AssertUnwindSafe(job));
                })?;
        }
        Ok(HeavyWork {
            budget: Budget::new(max_bytes),
            jobs,
        })
    }

    /// `work` on a heavy-work thread, holding a share of the budget of
    /// `bytes` until it ends (if the request waiting for it is dropped, the
    /// work goes on, and so does its share). A share larger than the whole
    /// budget is the whole budget: that work waits for all other heavy work
    /// to end, and runs alone.
    pub async fn run<T: Send + 'static>(
        &self,
        bytes: usize,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ProxyError> {
        let share = self.budget.share(bytes).await;
        self.run_held(move || {
            let out = work();
            drop(share);
            out
        })
        .await
    }

    /// `work` on a heavy-work thread, within a share its caller holds
    /// ([`HeavyWork::budget`]).
    pub async fn run_held<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ProxyError> {
        let (done, result) = oneshot::channel();
        let job = move || {
            let _ = done.send(work());
        };
        self.jobs
            .send(Box::new(job))
            .map_err(|_| ProxyError::Internal("the heavy-work threads are gone".into()))?;
        result
            .await
            .map_err(|_| ProxyError::Internal("heavy work failed".into()))
    }

    /// The budget: for work that takes its share itself, and for what is
    /// held now.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work runs, in turn where its shares do not fit together (with
    /// threads to spare), and a panicking job costs its caller an error,
    /// not a thread.
    #[tokio::test]
    async fn work_runs_within_its_budget_and_survives_a_panic() {
        let heavy = Arc::new(HeavyWork::new(4096, 3).unwrap());
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tasks: Vec<_> = (0..6)
            .map(|_| {
                let (heavy, running, most) = (heavy.clone(), running.clone(), most.clone());
                tokio::spawn(async move {
                    // 3 KiB of 4: one at a time.
                    heavy
                        .run(3072, move || {
                            use std::sync::atomic::Ordering::SeqCst;
                            let now = running.fetch_add(1, SeqCst) + 1;
                            most.fetch_max(now, SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(20));
                            running.fetch_sub(1, SeqCst);
                            7
                        })
                        .await
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap(), 7);
        }
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 1);
        // More than the whole budget: alone, not never.
        assert_eq!(heavy.run(1 << 30, || 1).await.unwrap(), 1);
        for _ in 0..4 {
            let e = heavy.run(1, || panic!("a job that panics")).await;
            assert!(matches!(e, Err(ProxyError::Internal(_))), "{e:?}");
        }
        assert_eq!(heavy.run(1, || 2).await.unwrap(), 2);

        // Work within a share its caller holds.
        let share = heavy.budget().try_share(3072).unwrap();
        assert_eq!(heavy.run_held(|| 3).await.unwrap(), 3);
        assert_eq!(heavy.budget().held(), 3072);
        drop(share);
        assert_eq!(heavy.budget().held(), 0);
    }
}
