//! One shutdown primitive: a cancellation token fanned out to every task, and
//! a tracker that the drain waits on for at most the grace period.

use std::pin::Pin;
use std::time::Duration;

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;

/// What [`Shutdown::watch`] gives: a future that can be polled again.
pub type Watch = Pin<Box<WaitForCancellationFutureOwned>>;

/// Cloned into the listener and every session.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    token: CancellationToken,
    tracker: TaskTracker,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the shutdown: the listener stops accepting, idle sessions close,
    /// and sessions with a request in flight close once it is answered.
    pub fn trigger(&self) {
        self.token.cancel();
    }

    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves once shutdown has been triggered (cancellation safe).
    pub async fn triggered(&self) {
        self.token.cancelled().await
    }

    /// [`Shutdown::triggered`] made once, to be polled beside every read
    /// of a session: it joins the token's waiters once, not once a request.
    /// It stays resolved once shutdown has been triggered.
    pub fn watch(&self) -> Watch {
        Box::pin(self.token.clone().cancelled_owned())
    }

    /// The tracker sessions are spawned on.
    pub fn tracker(&self) -> &TaskTracker {
        &self.tracker
    }

    /// Waits for every tracked task, at most `grace`; returns whether all finished.
    pub async fn drain(&self, grace: Duration) -> bool {
        self.tracker.close();
        tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    use super::*;

    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, SeqCst);
        }
    }

    #[test]
    fn a_watch_waits_wakes_once_triggered_and_stays_resolved() {
        let shutdown = Shutdown::new();
        let mut watch = shutdown.watch();
        let woken = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        // Polled again and again, as a session does beside each read.
        for _ in 0..3 {
            assert!(watch.as_mut().poll(&mut cx).is_pending());
        }
        assert!(!woken.0.load(SeqCst));
        shutdown.trigger();
        assert!(woken.0.load(SeqCst), "the waiting session is woken");
        for _ in 0..3 {
            assert_eq!(watch.as_mut().poll(&mut cx), Poll::Ready(()));
        }
        // One made after the trigger is resolved from the start.
        assert_eq!(shutdown.watch().as_mut().poll(&mut cx), Poll::Ready(()));
    }
}
