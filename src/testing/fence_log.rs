//! A fence log for processes under test: one line per fenced request answered by the server —
//! `member<TAB>shard<TAB>epoch<TAB>start_ns<TAB>end_ns`, wall clock — the format the end-to-end suite's
//! fence check reads. [`Controller`](crate::Controller) installs it when the environment variable
//! [`ENV`] names a file (builds with `test-util` only), so an operator under test needs no code for it.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::ownership::observe::{FenceEvent, FenceObserver, RequestOutcome};
use crate::ownership::Ownership;

/// The environment variable naming the fence log file (appended to).
pub const ENV: &str = "KUBE_SHARD_FENCE_LOG";

/// Writes the fence log (see the module docs).
#[derive(Debug)]
pub struct FenceLogWriter {
    file: Mutex<File>,
    state: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    /// fence → (member, shard, epoch)
    fences: HashMap<u64, (String, u32, u64)>,
    /// request → (fence, start ns)
    requests: HashMap<u64, (u64, u128)>,
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

impl FenceLogWriter {
    /// Append to `file`.
    #[must_use]
    pub fn new(file: File) -> Self {
        FenceLogWriter {
            file: Mutex::new(file),
            state: Mutex::new(Pending::default()),
        }
    }
}

impl FenceObserver for FenceLogWriter {
    fn on_event(&self, event: FenceEvent) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            FenceEvent::Issued {
                fence,
                member,
                shard,
                epoch,
                ..
            } => {
                st.fences.insert(fence, (member.to_string(), shard, epoch));
            }
            FenceEvent::RequestSent { request, fence, .. } => {
                st.requests.insert(request, (fence, now_ns()));
            }
            FenceEvent::RequestEnded {
                request, outcome, ..
            } => {
                let Some((fence, start)) = st.requests.remove(&request) else {
                    return;
                };
                if outcome != RequestOutcome::Answered {
                    return;
                }
                let Some((who, shard, epoch)) = st.fences.get(&fence).cloned() else {
                    return;
                };
                let line = format!("{who}\t{shard}\t{epoch}\t{start}\t{}\n", now_ns());
                let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
                let _ = f.write_all(line.as_bytes());
            }
            FenceEvent::Dropped { fence, .. } => {
                // a request holds a clone of its fence: none is in flight under a dropped fence
                st.fences.remove(&fence);
            }
        }
    }
}

/// Install a [`FenceLogWriter`] on `ownership` when [`ENV`] names a file; returns whether it did. A file
/// that cannot be opened is logged and ignored.
pub fn install_from_env(ownership: &Ownership) -> bool {
    let Some(path) = std::env::var_os(ENV) else {
        return false;
    };
    match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        Ok(file) => ownership.observe_fences(Arc::new(FenceLogWriter::new(file))),
        Err(e) => {
            tracing::warn!(path = ?path, error = %e, "cannot open the fence log");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ownership::MemberId;
    use crate::rt::Clock;

    #[test]
    fn one_line_per_answered_request_in_the_harness_format() {
        let path = std::env::temp_dir().join(format!("fence-log-{}", std::process::id()));
        let w = FenceLogWriter::new(File::create(&path).unwrap());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _rt = rt.enter();
        let at = Clock::system().now();
        let valid_until = at.plus(std::time::Duration::from_secs(1));
        w.on_event(FenceEvent::Issued {
            fence: 1,
            member: MemberId::new("a", "i1"),
            shard: 4,
            epoch: 9,
            at,
            valid_until,
        });
        for (request, outcome) in [(1, RequestOutcome::Answered), (2, RequestOutcome::TimedOut)] {
            w.on_event(FenceEvent::RequestSent {
                request,
                fence: 1,
                uid: None,
                at,
            });
            w.on_event(FenceEvent::RequestEnded {
                request,
                at,
                outcome,
            });
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
        assert_eq!(lines.len(), 1, "only the answered request: {text:?}");
        assert_eq!(&lines[0][..3], &["a/i1", "4", "9"]);
        let (start, end): (u128, u128) =
            (lines[0][3].parse().unwrap(), lines[0][4].parse().unwrap());
        assert!(start <= end && start > 0);
    }
}
