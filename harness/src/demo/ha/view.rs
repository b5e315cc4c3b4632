//! The live terminal view of `kshard-dev demo ha`: per cluster its HA role and epoch, the writer's counts,
//! the lag so far and the lost writes so far, redrawn in place (on a terminal only).

use std::fmt::Write as _;

use kube_shard_ha::HaHandle;

/// What the view shows.
pub(crate) struct Frame<'a> {
    pub(crate) phase: &'a str,
    pub(crate) elapsed: f64,
    pub(crate) clusters: [(&'a str, &'a HaHandle, bool); 2],
    pub(crate) acked: u64,
    pub(crate) refused: u64,
    pub(crate) lag_p50_ms: Option<f64>,
    pub(crate) lost: [Option<u64>; 3],
}

/// The frame's lines (ANSI; each clears its line).
pub(crate) fn render(f: &Frame<'_>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\x1b[2K\x1b[1mkshard-dev demo ha\x1b[0m  [{:6.1}s] {}",
        f.elapsed, f.phase
    );
    for (id, h, partitioned) in &f.clusters {
        let role = match h.active_epoch() {
            Some(e) => format!("\x1b[32mACTIVE\x1b[0m  epoch {}", e.wire()),
            None if h.demoting().is_some() => "\x1b[33mdemoting\x1b[0m".to_owned(),
            None => "standby".to_owned(),
        };
        let cut = if *partitioned {
            "  \x1b[31m(partitioned)\x1b[0m"
        } else {
            ""
        };
        let _ = writeln!(out, "\x1b[2K  cluster {id}: {role}{cut}");
    }
    let lag = f
        .lag_p50_ms
        .map_or_else(|| "-".to_owned(), |l| format!("{l:.0} ms"));
    let lost = |x: Option<u64>| x.map_or_else(|| "-".to_owned(), |n| n.to_string());
    let _ = writeln!(
        out,
        "\x1b[2K  writes acknowledged {}  refused (retried) {}  mirror lag p50 {lag}",
        f.acked, f.refused
    );
    let _ = writeln!(
        out,
        "\x1b[2K  lost: planned {}  unplanned {}  failback {}",
        lost(f.lost[0]),
        lost(f.lost[1]),
        lost(f.lost[2])
    );
    out
}

/// Lines a frame takes (to move the cursor back up before the next).
pub(crate) const LINES: usize = 5;
