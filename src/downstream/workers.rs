//! ① Where sessions run once accepted: on worker threads of their own,
//! apart from the runtime that accepts connections and runs the proxy's
//! background work (the dictionaries' watch, the topology's monitor, the
//! HTTP port).
//!
//! By default the worker threads form one runtime, and a session runs on
//! whichever of them is free: a session busy with a large rewrite does
//! not hold back the others that happened to share its thread. A single
//! thread (`threads = 1`, or one core) runs a single-threaded runtime,
//! which costs less per request than a runtime of one worker. Without
//! `work_stealing`, each thread runs a single-threaded runtime of its own
//! and serves the connections it was handed, the fewest first, from their
//! first message to their last (README, "Threads").

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

/// The worker threads, and the means to stop them: dropping `Workers`
/// ends every thread's runtime, and the sessions still on it.
#[derive(Debug)]
pub struct Workers {
    workers: Vec<Worker>,
    /// Where the search for the least busy worker starts: it goes round,
    /// so that workers serving as many sessions take turns.
    turn: AtomicUsize,
    /// With work stealing, the one runtime all threads share.
    shared: Option<Runtime>,
}

#[derive(Debug)]
struct Worker {
    runtime: Handle,
    /// Sessions being served.
    sessions: Arc<AtomicUsize>,
    /// Dropped with the worker: its thread's runtime then stops.
    _stop: Option<oneshot::Sender<()>>,
}

impl Workers {
    /// Starts `threads` worker threads (0: one per core, as the process's
    /// CPU affinity and quota allow): one runtime they share with
    /// `work_stealing` and more than one thread, else a runtime each.
    pub fn start(threads: usize, work_stealing: bool) -> std::io::Result<Workers> {
        let threads = match threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        };
        if work_stealing && threads > 1 {
            let runtime = Builder::new_multi_thread()
                .worker_threads(threads)
                .thread_name("laconic-worker")
                .enable_all()
                .build()?;
            return Ok(Workers {
                workers: vec![Worker {
                    runtime: runtime.handle().clone(),
                    sessions: Arc::default(),
                    _stop: None,
                }],
                turn: AtomicUsize::new(0),
                shared: Some(runtime),
            });
        }
        let workers = (0..threads)
            .map(|i| {
                let runtime = Builder::new_current_thread().enable_all().build()?;
                let handle = runtime.handle().clone();
                let (stop, stopped) = oneshot::channel::<()>();
                std::thread::Builder::new()
                    .name(format!("laconic-worker-{i}"))
                    .spawn(move || {
                        // Runs the sessions handed to it until `stop` is
                        // dropped; the runtime then drops what is left.
                        let _ = runtime.block_on(stopped);
                    })?;
                Ok(Worker {
                    runtime: handle,
                    sessions: Arc::default(),
                    _stop: Some(stop),
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Workers {
            workers,
            turn: AtomicUsize::new(0),
            shared: None,
        })
    }

    /// How many runtimes sessions are spread over (1 with work stealing).
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Runs the session `make` builds on the worker serving the fewest,
    /// tracked by `tracker` (the drain waits for it). `make` runs on that
    /// worker: what it registers there (the socket) is polled there.
    pub fn spawn<F, S>(&self, tracker: &TaskTracker, make: F)
    where
        F: FnOnce() -> S + Send + 'static,
        S: Future<Output = ()> + Send + 'static,
    {
        let worker = self.least_busy();
        let sessions = worker.sessions.clone();
        sessions.fetch_add(1, Relaxed);
        let serve = async move {
            let _served = Served(sessions);
            make().await;
        };
        worker.runtime.spawn(tracker.track_future(serve));
    }

    fn least_busy(&self) -> &Worker {
        let n = self.workers.len();
        let start = self.turn.fetch_add(1, Relaxed);
        (0..n)
            .map(|i| &self.workers[(start + i) % n])
            .min_by_key(|w| w.sessions.load(Relaxed))
            .expect("at least one worker")
    }

    /// Sessions each worker serves now.
    pub fn sessions(&self) -> Vec<usize> {
        self.workers
            .iter()
            .map(|w| w.sessions.load(Relaxed))
            .collect()
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

/// Counts a session out of its worker when it ends, however it ends.
struct Served(Arc<AtomicUsize>);

impl Drop for Served {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sessions go to the worker serving the fewest, each runs on a thread
    /// of its worker, and a worker's count falls when a session ends.
    #[tokio::test]
    async fn sessions_go_to_the_least_busy_worker_and_stay_there() {
        let workers = Workers::start(2, false).unwrap();
        let tracker = TaskTracker::new();
        let (release, released) = tokio::sync::watch::channel(false);
        let (threads, mut seen) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..4 {
            let (threads, mut released) = (threads.clone(), released.clone());
            workers.spawn(&tracker, move || async move {
                let first = std::thread::current().id();
                // Across awaits the session stays on its thread.
                let _ = released.wait_for(|r| *r).await;
                let _ = threads.send((first, std::thread::current().id()));
            });
        }
        assert_eq!(workers.sessions(), vec![2, 2]);
        release.send(true).unwrap();
        tracker.close();
        tracker.wait().await;
        drop(threads);
        let mut per_thread = std::collections::HashMap::new();
        while let Some((first, last)) = seen.recv().await {
            assert_eq!(first, last);
            assert_ne!(first, std::thread::current().id());
            *per_thread.entry(first).or_insert(0) += 1;
        }
        assert_eq!(per_thread.len(), 2);
        assert!(per_thread.values().all(|&n| n == 2));
        assert_eq!(workers.sessions(), vec![0, 0]);
    }

    /// With work stealing there is one runtime, and sessions run on its
    /// threads; dropping the workers inside a runtime does not panic. One
    /// thread is always a runtime of its own.
    #[tokio::test]
    async fn work_stealing_runs_sessions_on_one_shared_runtime() {
        let one = Workers::start(1, true).unwrap();
        assert!(one.shared.is_none());
        assert_eq!(one.len(), 1);
        let workers = Workers::start(2, true).unwrap();
        assert!(workers.shared.is_some());
        assert_eq!(workers.len(), 1);
        let tracker = TaskTracker::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        workers.spawn(&tracker, move || async move {
            let _ = tx.send(std::thread::current().name().map(str::to_owned));
        });
        assert_eq!(rx.await.unwrap().as_deref(), Some("laconic-worker"));
        tracker.close();
        tracker.wait().await;
        drop(workers);
    }
}
