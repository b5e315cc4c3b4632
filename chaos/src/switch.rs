//! A member's process switch: every task the member starts is wrapped in it, so pausing the member freezes
//! all of them and killing it ends all of them (each is dropped at its next poll).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures::future::BoxFuture;
use kube_shard::rt::Spawner;

#[derive(Default)]
struct State {
    frozen: bool,
    dead: bool,
    wakers: Vec<Waker>,
}

/// Pause, resume or kill everything a member started.
#[derive(Clone, Default)]
pub struct Switch(Arc<Mutex<State>>);

impl Switch {
    fn edit(&self, f: impl FnOnce(&mut State)) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut s);
        for w in s.wakers.drain(..) {
            w.wake();
        }
    }

    /// Freeze (`true`) or resume every wrapped task.
    pub fn set_frozen(&self, frozen: bool) {
        self.edit(|s| s.frozen = frozen);
    }

    /// End every wrapped task (for good).
    pub fn kill(&self) {
        self.edit(|s| s.dead = true);
    }

    /// Whether [`Switch::kill`] was called.
    #[must_use]
    pub fn is_dead(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).dead
    }

    /// `fut` under this switch: it resolves to `None` once killed.
    pub fn wrap<F: Future + Send + 'static>(&self, fut: F) -> Switched<F> {
        Switched {
            inner: Box::pin(fut),
            switch: self.clone(),
        }
    }

    /// A spawner that starts every task under this switch on the current runtime.
    #[must_use]
    pub fn spawner(&self) -> Spawner {
        let sw = self.clone();
        Spawner::new(move |task: BoxFuture<'static, ()>| {
            tokio::spawn(sw.wrap(task));
        })
    }
}

/// A future under a [`Switch`].
pub struct Switched<F: Future> {
    inner: Pin<Box<F>>,
    switch: Switch,
}

impl<F: Future> Future for Switched<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        {
            let mut s = self.switch.0.lock().unwrap_or_else(|e| e.into_inner());
            if s.dead {
                return Poll::Ready(None);
            }
            if s.frozen {
                s.wakers.push(cx.waker().clone());
                return Poll::Pending;
            }
        }
        self.inner.as_mut().poll(cx).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::Switch;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_frozen_member_makes_no_progress_in_any_task_it_spawned_and_a_killed_one_ends() {
        let sw = Switch::default();
        let ticks = Arc::new(AtomicU32::new(0));
        let t = ticks.clone();
        // a task spawned through the member's spawner (a sub-watch, an Event...)
        sw.spawner().spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                t.fetch_add(1, Ordering::SeqCst);
            }
        });
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        assert_eq!(ticks.load(Ordering::SeqCst), 3);
        sw.set_frozen(true);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(ticks.load(Ordering::SeqCst), 3, "frozen: no progress");
        sw.set_frozen(false);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(ticks.load(Ordering::SeqCst) >= 4, "resumed");
        sw.kill();
        let at_kill = ticks.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(ticks.load(Ordering::SeqCst), at_kill, "killed: ended");
        assert!(sw.is_dead());
    }
}
