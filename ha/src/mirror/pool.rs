//! The worker pool of one kind ([`super::MirrorConfig::workers`]): up to `size` applies in flight at once,
//! each on a task of its own so that they run while the kind's task serves its probes, checkpoints and
//! deliveries. The pool does not choose keys: the retry queue gives a key only when it is not in flight
//! (one apply per object at a time, so one object's changes stay in order). Each apply holds the hold's
//! guard ([`Writing`]) until it ends: a hold waits for the applies in flight.

use std::future::Future;
use std::pin::Pin;

use futures::stream::{FuturesUnordered, StreamExt};

use super::apply::{worker_ended, Outcome};
use super::hold::Writing;
use super::queue::Key;

/// The end of one apply: its key and outcome (`Sync`: the kind's task is shared across its awaits).
type Ending = Pin<Box<dyn Future<Output = (Key, Outcome)> + Send + Sync>>;

/// The applies in flight of one kind.
pub(super) struct Pool {
    running: FuturesUnordered<Ending>,
    size: usize,
}

impl Pool {
    /// A pool of `size` workers (at least one).
    pub(super) fn new(size: usize) -> Self {
        Pool {
            running: FuturesUnordered::new(),
            size: size.max(1),
        }
    }

    /// Whether another apply may start.
    pub(super) fn has_room(&self) -> bool {
        self.running.len() < self.size
    }

    /// Whether no apply is in flight.
    pub(super) fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Applies in flight.
    pub(super) fn len(&self) -> usize {
        self.running.len()
    }

    /// Run `job` (the apply of `key`) on a task of its own under `writing`, released when it ends.
    pub(super) fn start<F>(&mut self, key: Key, writing: Writing, job: F)
    where
        F: Future<Output = Outcome> + Send + 'static,
    {
        let h = tokio::spawn(async move {
            let out = job.await;
            drop(writing);
            out
        });
        self.running.push(Box::pin(async move {
            let out = h.await.unwrap_or_else(worker_ended);
            (key, out)
        }));
    }

    /// The next apply to end (`None` at once when none is in flight: guard a `select!` branch with
    /// [`is_empty`](Self::is_empty)). Cancel-safe: an apply not yet ended stays in the pool.
    pub(super) async fn next(&mut self) -> Option<(Key, Outcome)> {
        self.running.next().await
    }
}

#[cfg(test)]
mod tests {
    use super::super::hold::Hold;
    use super::super::queue::{Backoff, RetryQueue};
    use super::*;
    use futures::future::BoxFuture;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    fn k(n: &str) -> Key {
        ("ns".into(), n.into())
    }

    /// An apply that takes `d` and counts itself in flight meanwhile (the most at once in `most`).
    fn job(
        d: Duration,
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
    ) -> BoxFuture<'static, Outcome> {
        Box::pin(async move {
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(d).await;
            now.fetch_sub(1, Ordering::SeqCst);
            Outcome::Applied(None)
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_pool_of_eight_runs_eight_applies_at_once_never_two_of_one_key() {
        let mut q = RetryQueue::new(Backoff::default());
        let t = Duration::ZERO;
        for i in 0..20 {
            q.push(k(&format!("o{i:02}")), 100 + i, t);
        }
        let hold = Hold::default();
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut pool = Pool::new(8);
        let mut in_flight = std::collections::BTreeSet::new();
        let mut applied = 0;
        let t0 = tokio::time::Instant::now();
        loop {
            while pool.has_room() {
                let Some(key) = q.pop(t) else { break };
                assert!(in_flight.insert(key.clone()), "{key:?} twice at once");
                // a change of a key in flight: queued again after it, not started beside it
                if key.1 == "o03" && applied == 0 {
                    q.push(key.clone(), 500, t);
                }
                let w = hold.try_writing().unwrap();
                pool.start(
                    key,
                    w,
                    job(Duration::from_millis(100), now.clone(), most.clone()),
                );
            }
            let Some((key, out)) = pool.next().await else {
                break;
            };
            assert_eq!(out, Outcome::Applied(None));
            in_flight.remove(&key);
            q.done(&key, t);
            applied += 1;
        }
        assert_eq!(applied, 21, "o03 twice, after each other");
        assert_eq!(most.load(Ordering::SeqCst), 8);
        assert!(q.is_empty());
        // 21 applies of 100 ms, eight at a time: three rounds, not 21
        assert_eq!(t0.elapsed(), Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_mirror_starts_no_apply_and_waits_for_the_ones_in_flight() {
        let hold = Hold::default();
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut pool = Pool::new(8);
        for i in 0..3 {
            let w = hold.try_writing().unwrap();
            pool.start(
                k(&format!("o{i}")),
                w,
                job(Duration::from_secs(2), now.clone(), most.clone()),
            );
        }
        let h = hold.clone();
        let holding = tokio::spawn(async move { h.hold("t1").await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(now.load(Ordering::SeqCst), 3);
        assert!(
            !holding.is_finished(),
            "the hold waits for the applies in flight"
        );
        assert!(hold.held());
        assert!(hold.try_writing().is_none(), "no apply starts meanwhile");
        let mut ended = 0;
        while let Some((_, out)) = pool.next().await {
            assert_eq!(out, Outcome::Applied(None));
            ended += 1;
        }
        assert_eq!(ended, 3);
        holding.await.unwrap();
        assert_eq!(now.load(Ordering::SeqCst), 0, "held only once they ended");
        assert!(hold.try_writing().is_none(), "held at the token");
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_apply_is_retried_and_releases_the_hold() {
        let hold = Hold::default();
        let mut pool = Pool::new(1);
        let w = hold.try_writing().unwrap();
        pool.start(k("p"), w, async { panic!("planted") });
        let (key, out) = pool.next().await.unwrap();
        assert_eq!(key, k("p"));
        assert!(
            matches!(&out, Outcome::Retry(f) if f.text.contains("the worker ended")),
            "{out:?}"
        );
        hold.hold("t").await;
        assert!(pool.is_empty());
    }
}
