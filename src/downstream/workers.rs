//! ① Where sessions run once accepted: on worker threads of their own,
//! apart from the thread that accepts connections and runs the proxy's
//! background work (the dictionaries' watch, the topology's monitor, the
//! HTTP port).
//!
//! Several threads share one runtime, and a session runs on whichever of
//! them is free: a session busy with a rewrite does not hold back the
//! others. One thread runs a single-threaded runtime, which costs less per
//! request than a shared runtime: no thread is woken to look for work
//! another already has (README, "Threads").

use std::future::Future;

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

/// The worker threads. Dropping them ends their runtime, and the sessions
/// still on it.
#[derive(Debug)]
pub struct Workers {
    runtime: Handle,
    /// Several threads: their runtime, stopped without waiting when the
    /// workers are dropped.
    shared: Option<Runtime>,
    /// One thread: dropped with the workers, which stops its runtime.
    _stop: Option<oneshot::Sender<()>>,
}

impl Workers {
    /// Starts `threads` worker threads (0: one per core, as the process's
    /// CPU affinity and quota allow).
    pub fn start(threads: usize) -> std::io::Result<Workers> {
        let threads = match threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        };
        if threads > 1 {
            let runtime = Builder::new_multi_thread()
                .worker_threads(threads)
                .thread_name("laconic-worker")
                .enable_all()
                .build()?;
            return Ok(Workers {
                runtime: runtime.handle().clone(),
                shared: Some(runtime),
                _stop: None,
            });
        }
        let runtime = Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("laconic-worker".into())
            // Runs the sessions until `stop` is dropped; the runtime then
            // drops what is left, on this thread.
            .spawn(move || {
                let _ = runtime.block_on(stopped);
            })?;
        Ok(Workers {
            runtime: handle,
            shared: None,
            _stop: Some(stop),
        })
    }

    /// Runs `session` on the workers, tracked by `tracker` (the drain waits
    /// for it). It is first polled there: what it registers then (its
    /// socket) is polled there.
    pub fn spawn(&self, tracker: &TaskTracker, session: impl Future<Output = ()> + Send + 'static) {
        self.runtime.spawn(tracker.track_future(session));
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // A runtime of several threads may not be dropped where a runtime
        // is running (it would block); this one is stopped without waiting.
        if let Some(shared) = self.shared.take() {
            shared.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sessions run on the worker threads, not the caller's; the drain
    /// waits for them; the workers can be dropped inside a runtime.
    #[tokio::test]
    async fn sessions_run_on_the_workers_and_are_tracked() {
        for threads in [1, 2] {
            let workers = Workers::start(threads).unwrap();
            assert_eq!(workers.shared.is_some(), threads > 1);
            let tracker = TaskTracker::new();
            let (release, released) = tokio::sync::watch::channel(false);
            let (seen, mut threads_seen) = tokio::sync::mpsc::unbounded_channel();
            for _ in 0..4 {
                let (seen, mut released) = (seen.clone(), released.clone());
                workers.spawn(&tracker, async move {
                    let _ = released.wait_for(|r| *r).await;
                    let me = std::thread::current();
                    let _ = seen.send((me.id(), me.name().map(str::to_owned)));
                });
            }
            drop(seen);
            tracker.close();
            assert_eq!(tracker.len(), 4, "the sessions are tracked until they end");
            release.send(true).unwrap();
            tracker.wait().await;
            let mut ran = 0;
            while let Some((id, name)) = threads_seen.recv().await {
                assert_ne!(id, std::thread::current().id());
                assert_eq!(name.as_deref(), Some("laconic-worker"));
                ran += 1;
            }
            assert_eq!(ran, 4);
            drop(workers);
        }
    }
}
