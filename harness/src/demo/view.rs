//! The live terminal view: per replica its owned shards, Widgets and reconciles, and the ring (the 2^64
//! hash space as a bar, coloured by owner).

use std::fmt::Write as _;

use super::{Demo, GroupSnap};

const WIDTH: usize = 64;
const COLORS: [u8; 8] = [39, 208, 41, 171, 226, 203, 51, 135];

fn color_of(idx: usize) -> u8 {
    COLORS[idx % COLORS.len()]
}

/// The replica index in a name like `replica-3`.
fn index_of(name: &str) -> usize {
    name.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

pub(super) fn render(d: &Demo<'_>, g: &GroupSnap) -> String {
    let s = d.s();
    let owners = g.owners();
    let moving: Vec<bool> = (0..s.get())
        .map(|sh| {
            g.assignment.as_ref().is_some_and(|a| {
                a.view
                    .shards
                    .get(&sh)
                    .is_some_and(|sa| sa.handoff != kube_shard::group::assignment::Handoff::Stable)
            })
        })
        .collect();
    let mut out = String::new();
    let gen = g.assignment.as_ref().map_or(0, |a| a.view.generation);
    let _ = writeln!(
        out,
        "\x1b[2K\x1b[1mkshard-dev demo\x1b[0m  {}  generation {gen}  coordinator {}",
        d.phase,
        g.coordinator.as_deref().unwrap_or("-")
    );
    let _ = writeln!(
        out,
        "\x1b[2K  {:<11} {:>7} {:>8} {:>11}",
        "replica", "shards", "widgets", "reconciles"
    );
    for r in &d.replicas {
        let owned: Vec<u32> = owners
            .iter()
            .enumerate()
            .filter(|(_, o)| o.as_deref() == Some(r.name.as_str()))
            .map(|(i, _)| i as u32)
            .collect();
        let widgets: u64 = owned.iter().map(|sh| d.per_shard[*sh as usize]).sum();
        let rec = match g.reconciles.get(&r.name) {
            Some(n) => n.to_string(),
            None => "-".to_owned(),
        };
        let state = if r.alive { "" } else { "  (killed)" };
        let _ = writeln!(
            out,
            "\x1b[2K  \x1b[38;5;{}m■\x1b[0m {:<9} {:>7} {:>8} {:>11}{state}",
            color_of(index_of(&r.name)),
            r.name,
            owned.len(),
            widgets,
            rec
        );
    }
    // the ring
    let n = s.get() as usize;
    let mut bar = String::new();
    for cell in 0..WIDTH {
        let shard = cell * n / WIDTH;
        match &owners[shard] {
            Some(o) => {
                let ch = if moving[shard] { '▒' } else { '█' };
                let _ = write!(bar, "\x1b[38;5;{}m{ch}", color_of(index_of(o)));
            }
            None => bar.push_str("\x1b[0m·"),
        }
    }
    let _ = writeln!(out, "\x1b[2K  0 \x1b[0m{bar}\x1b[0m 2^64");
    if let Some(r) = &d.refused {
        let _ = writeln!(
            out,
            "\x1b[2K  refused by the apiserver's fence policies: {} of members that had lost the shard, {} of current owners",
            r.deposed, r.current_owner
        );
    }
    out
}
