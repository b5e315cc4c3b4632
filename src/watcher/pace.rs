//! The pace of re-enqueues: bursts of up to 1000 `ObjectRef`s, then about 1000 per second with ±20 %
//! jitter, so a takeover of many shards does not reach the reconciler as one thundering herd.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

pub(crate) struct Pace {
    pub(crate) tokens: f64,
    last: Option<tokio::time::Instant>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

const PACE_BURST: f64 = 1000.0;
const PACE_RATE: f64 = 1000.0;

impl Pace {
    pub(crate) fn new() -> Self {
        Pace {
            tokens: PACE_BURST,
            last: None,
            sleep: None,
        }
    }

    pub(crate) fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(sleep) = self.sleep.as_mut() {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
        let now = tokio::time::Instant::now();
        if let Some(last) = self.last {
            self.tokens =
                (self.tokens + now.duration_since(last).as_secs_f64() * PACE_RATE).min(PACE_BURST);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            Poll::Ready(())
        } else {
            let wait = crate::rt::jitter(Duration::from_millis(100));
            let mut sleep = Box::pin(tokio::time::sleep(wait));
            if sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            self.sleep = Some(sleep);
            Poll::Pending
        }
    }
}
