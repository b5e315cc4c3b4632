//! Shared machinery of the stateright models: a liveness check ("from every reachable state, a fault-free
//! path reaches the goal"), stateright runs with state counts, and a deterministic symmetry representative.

mod handoff;
mod takeover;

use std::{
    collections::{hash_map::DefaultHasher, HashMap, VecDeque},
    fmt::Debug,
    hash::{Hash, Hasher},
    time::Instant,
};

use stateright::{Checker, Model};

/// A fault a model plants wherever it steps the library: planting is per thread, and stateright's checker
/// steps the model on threads of its own.
pub(crate) type Plant = Option<crate::testing::faults::Fault>;

/// Switch `plant` on for the calling thread (a model calls this before stepping the library).
pub(crate) fn plant(plant: Plant) {
    if let Some(fault) = plant {
        crate::testing::faults::set(fault, true);
    }
}

/// Run stateright's BFS checker until an `always` property fails; returns the property and the path to it.
/// The search runs on the checker's threads: a model that plants a bug does so itself ([`plant`]).
pub(crate) fn find_violation<M>(
    name: &str,
    model: M,
    symmetry: fn(&M::State) -> M::State,
) -> Option<(&'static str, Vec<M::Action>)>
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Debug + Clone + Send + Sync + PartialEq,
    M::Action: Debug + Clone + Send + Sync + PartialEq,
{
    let start = Instant::now();
    let always: Vec<&'static str> = model
        .properties()
        .into_iter()
        .filter(|p| matches!(p.expectation, stateright::Expectation::Always))
        .map(|p| p.name)
        .collect();
    let checker = model
        .checker()
        .threads(2)
        .symmetry_fn(symmetry)
        .finish_when(stateright::HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    eprintln!(
        "[{name}] stateright: {} states, {} unique, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        start.elapsed()
    );
    always
        .into_iter()
        .find_map(|p| checker.discovery(p).map(|path| (p, path.into_actions())))
}

/// Whether the deeper configurations (N = 3) run: `KSHARD_MODEL_DEEP=1`.
pub(crate) fn deep() -> bool {
    std::env::var("KSHARD_MODEL_DEEP").is_ok_and(|v| v == "1")
}

/// The variant of `candidates` with the smallest (deterministic) hash: a symmetry representative.
pub(crate) fn representative<S: Hash + Clone>(candidates: &[S]) -> S {
    candidates
        .iter()
        .min_by_key(|s| {
            let mut h = DefaultHasher::new();
            s.hash(&mut h);
            h.finish()
        })
        .expect("at least one candidate")
        .clone()
}

/// Run stateright's BFS checker (safety properties), print the counts, assert a floor on them and no
/// discovery of a failing property. Returns the unique state count.
pub(crate) fn check_safety<M>(
    name: &str,
    model: M,
    symmetry: fn(&M::State) -> M::State,
    floor: usize,
) -> usize
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Debug + Clone + Send + Sync + PartialEq,
    M::Action: Debug + Clone + Send + Sync + PartialEq,
{
    let start = Instant::now();
    let checker = model
        .checker()
        .threads(2)
        .symmetry_fn(symmetry)
        .spawn_bfs()
        .join();
    let unique = checker.unique_state_count();
    eprintln!(
        "[{name}] stateright: {} states, {unique} unique, max depth {}, {:.1?}",
        checker.state_count(),
        checker.max_depth(),
        start.elapsed()
    );
    checker.assert_properties();
    assert!(
        unique >= floor,
        "[{name}] only {unique} unique states (floor {floor}): the model shrank"
    );
    unique
}

/// Breadth-first search on the calling thread (stateright's checker runs on its own threads, where a
/// per-thread planted bug is off) for the shallowest state that breaks an `always` property. Returns the
/// property's name and the path to it.
pub(crate) fn first_violation<M>(
    model: &M,
    canon: fn(&M::State) -> M::State,
) -> Option<(&'static str, Vec<M::Action>)>
where
    M: Model,
    M::State: Hash + Clone,
    M::Action: Clone,
{
    let fp = |s: &M::State| {
        let mut h = DefaultHasher::new();
        s.hash(&mut h);
        h.finish()
    };
    let always: Vec<_> = model
        .properties()
        .into_iter()
        .filter(|p| matches!(p.expectation, stateright::Expectation::Always))
        .collect();
    let mut seen = std::collections::HashSet::new();
    let mut queue: VecDeque<(M::State, Vec<M::Action>)> = VecDeque::new();
    for s in model.init_states() {
        let s = canon(&s);
        if seen.insert(fp(&s)) {
            queue.push_back((s, Vec::new()));
        }
    }
    let mut actions = Vec::new();
    while let Some((st, path)) = queue.pop_front() {
        if let Some(p) = always.iter().find(|p| !(p.condition)(model, &st)) {
            return Some((p.name, path));
        }
        actions.clear();
        model.actions(&st, &mut actions);
        for a in actions.drain(..) {
            let Some(next) = model.next_state(&st, a.clone()) else {
                continue;
            };
            let next = canon(&next);
            if seen.insert(fp(&next)) {
                let mut p = path.clone();
                p.push(a);
                queue.push_back((next, p));
            }
        }
    }
    None
}

/// The outcome of [`check_liveness`].
#[derive(Debug)]
pub(crate) struct Liveness<S, A> {
    /// States explored (after symmetry reduction).
    pub(crate) states: usize,
    /// A path (actions, then the stuck state) to a state from which no fault-free path reaches the goal.
    pub(crate) stuck: Option<(Vec<A>, S)>,
}

/// Explore every reachable state (up to `canon`) and check that from each one a path of non-fault actions
/// reaches a goal state ("after faults stop, the system settles").
pub(crate) fn check_liveness<M>(
    model: &M,
    canon: fn(&M::State) -> M::State,
    is_fault: fn(&M::Action) -> bool,
    goal: fn(&M, &M::State) -> bool,
) -> Liveness<M::State, M::Action>
where
    M: Model,
    M::State: Hash + Eq + Clone + Debug,
    M::Action: Clone + Debug,
{
    // keyed by a 64-bit fingerprint, as stateright does: each state is stored once
    let fp = |s: &M::State| {
        let mut h = DefaultHasher::new();
        s.hash(&mut h);
        h.finish()
    };
    let mut index: HashMap<u64, u32> = HashMap::new();
    let mut states: Vec<M::State> = Vec::new();
    let mut parent: Vec<Option<(u32, M::Action)>> = Vec::new();
    let mut rev: Vec<Vec<u32>> = Vec::new();
    let mut queue = VecDeque::new();
    for s in model.init_states() {
        let s = canon(&s);
        if let std::collections::hash_map::Entry::Vacant(e) = index.entry(fp(&s)) {
            e.insert(states.len() as u32);
            states.push(s);
            parent.push(None);
            rev.push(Vec::new());
            queue.push_back(states.len() as u32 - 1);
        }
    }
    let mut actions = Vec::new();
    while let Some(i) = queue.pop_front() {
        let st = states[i as usize].clone();
        actions.clear();
        model.actions(&st, &mut actions);
        for a in actions.drain(..) {
            let Some(next) = model.next_state(&st, a.clone()) else {
                continue;
            };
            if !model.within_boundary(&next) {
                continue;
            }
            let next = canon(&next);
            let key = fp(&next);
            let j = match index.get(&key) {
                Some(&j) => j,
                None => {
                    let j = states.len() as u32;
                    index.insert(key, j);
                    states.push(next);
                    parent.push(Some((i, a.clone())));
                    rev.push(Vec::new());
                    queue.push_back(j);
                    j
                }
            };
            if !is_fault(&a) {
                rev[j as usize].push(i);
            }
        }
    }
    drop(index);
    // backward reachability of the goal along fault-free edges
    let mut good = vec![false; states.len()];
    let mut queue: VecDeque<u32> = (0..states.len() as u32)
        .filter(|&i| goal(model, &states[i as usize]))
        .collect();
    for &i in &queue {
        good[i as usize] = true;
    }
    while let Some(j) = queue.pop_front() {
        for &i in &rev[j as usize] {
            if !good[i as usize] {
                good[i as usize] = true;
                queue.push_back(i);
            }
        }
    }
    // the shallowest stuck state (BFS order = shortest path)
    let stuck = good.iter().position(|g| !g).map(|i| {
        let mut path = Vec::new();
        let mut k = i;
        while let Some((p, a)) = &parent[k] {
            path.push(a.clone());
            k = *p as usize;
        }
        path.reverse();
        (path, states[i].clone())
    });
    Liveness {
        states: states.len(),
        stuck,
    }
}
