//! Switching the library's planted bugs on for one seed (feature `planted-bugs`).

/// Switch `name` on for the calling thread; returns what to switch off afterwards.
///
/// # Panics
/// When `name` is not a planted bug, or the crate was built without `planted-bugs`.
#[cfg(feature = "planted-bugs")]
pub fn switch_on(name: Option<&str>) -> Option<kube_shard::ownership::planted::Bug> {
    use kube_shard::ownership::planted::{set, Bug};
    let name = name?;
    let bug = Bug::ALL
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, b)| *b)
        .unwrap_or_else(|| panic!("no planted bug {name:?}"));
    set(bug, true);
    Some(bug)
}

/// Switch it off again.
#[cfg(feature = "planted-bugs")]
pub fn switch_off(bug: Option<kube_shard::ownership::planted::Bug>) {
    if let Some(b) = bug {
        kube_shard::ownership::planted::set(b, false);
    }
}

/// Without the feature there is nothing to plant.
///
/// # Panics
/// When a bug is asked for.
#[cfg(not(feature = "planted-bugs"))]
pub fn switch_on(name: Option<&str>) -> Option<()> {
    assert!(
        name.is_none(),
        "--plant needs the planted-bugs feature (cargo run -p kube-shard-chaos --features planted-bugs)"
    );
    None
}

/// Without the feature there is nothing to switch off.
#[cfg(not(feature = "planted-bugs"))]
pub fn switch_off(_: Option<()>) {}

/// The names of the bugs that can be planted.
#[must_use]
pub fn names() -> Vec<&'static str> {
    #[cfg(feature = "planted-bugs")]
    {
        kube_shard::ownership::planted::Bug::ALL
            .iter()
            .map(|(n, _)| *n)
            .collect()
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        Vec::new()
    }
}
