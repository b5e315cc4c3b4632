//! Applying a fault to the world, and the writer that changes Widgets meanwhile.

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use kube_shard::group::admin::{Edit, GroupRef};
use kube_shard::group::assignment::Handoff;
use kube_shard::group::assignment::{Assignment, DATA_KEY};
use kube_shard::ownership::ShardState;
use kube_shard::{ShardCount, ShardKey};
use kube_shard_example_operator::widget::{Widget, WidgetSpec, PLURAL};
use kube_shard_testserver::{FailRule, GateSkew, Scope, Target, Verb};

use crate::check::Finding;
use crate::fault::Fault;
use crate::rng::Rng;
use crate::world::{shards, World, CP_NS, FENCE_PARAMS, GROUP, MARGIN, NS, RENEW};

fn later(after: Duration, f: impl FnOnce() + Send + 'static) {
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        f();
    });
}

/// The live member `i` points at (modulo their number).
fn pick(w: &World, i: usize) -> Option<usize> {
    let live = w.live();
    (!live.is_empty()).then(|| live[i % live.len()])
}

/// The member holding the coordinator Lease, if it is one of ours and alive.
async fn coordinator(w: &World) -> Option<usize> {
    let leases: Api<Lease> = Api::namespaced(w.server.client("admin"), CP_NS);
    let l = leases
        .get_opt(&format!("{GROUP}-coordinator"))
        .await
        .ok()??;
    let holder = l.spec?.holder_identity?;
    let name = holder.split('/').next()?.to_owned();
    w.live()
        .into_iter()
        .rev()
        .find(|&i| w.members[i].name == name)
}

/// Apply `f` now.
pub async fn apply(w: &mut World, f: &Fault) {
    w.note(format!("fault {f:?}"));
    let faults = w.server.faults();
    match *f {
        Fault::Kill { member } => kill(w, pick(w, member)),
        Fault::Pause { member, secs } => {
            if let Some(i) = pick(w, member) {
                let sw = w.members[i].switch.clone();
                sw.set_frozen(true);
                later(Duration::from_secs(secs), move || sw.set_frozen(false));
            }
        }
        Fault::Partition { member, secs } => {
            if let Some(i) = pick(w, member) {
                let scope = Scope::identity(w.members[i].name.clone());
                faults.partition(scope.clone(), true);
                later(Duration::from_secs(secs), move || {
                    faults.partition(scope, false);
                });
            }
        }
        Fault::KillCoordinator => {
            let c = coordinator(w).await;
            kill(w, c);
        }
        Fault::ScaleUp => {
            let n = w.fresh_name();
            w.spawn(&n);
        }
        Fault::Leave { member } => leave(w, pick(w, member)),
        Fault::RollingRestart { member } => {
            if let Some(i) = pick(w, member) {
                let name = w.members[i].name.clone();
                leave(w, Some(i));
                w.spawn(&name);
            }
        }
        Fault::SameName { member } => {
            if let Some(i) = pick(w, member) {
                let name = w.members[i].name.clone();
                w.spawn(&name);
            }
        }
        Fault::ErrorBurst { code, times } => {
            faults.fail_next(Scope::All, FailRule::status(code).times(times));
        }
        Fault::Latency { ms, secs } => {
            faults.latency(Scope::All, Some(Duration::from_millis(ms)));
            later(Duration::from_secs(secs), move || {
                faults.latency(Scope::All, None);
            });
        }
        Fault::CloseWatches => faults.close_watches(Scope::All),
        Fault::FreezeWatches { secs } => {
            faults.freeze_watches(Scope::All, true);
            later(Duration::from_secs(secs), move || {
                faults.freeze_watches(Scope::All, false);
            });
        }
        Fault::Compact => faults.compact(),
        Fault::Outage { secs } => faults.outage(Duration::from_secs(secs)),
        Fault::DeleteAssignment => {
            let cms: Api<ConfigMap> = Api::namespaced(w.server.client("admin"), CP_NS);
            let _ = cms
                .delete(&format!("{GROUP}-assignment"), &DeleteParams::default())
                .await;
        }
        Fault::CorruptAssignment => {
            w.undecodable = true;
            let cms: Api<ConfigMap> = Api::namespaced(w.server.client("admin"), CP_NS);
            let patch = serde_json::json!({"data": {DATA_KEY: "not an assignment"}});
            let _ = cms
                .patch(
                    &format!("{GROUP}-assignment"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await;
        }
        Fault::DeleteMemberLease { member } => {
            if let Some(i) = pick(w, member) {
                let leases: Api<Lease> = Api::namespaced(w.server.client("admin"), CP_NS);
                let name = format!("{GROUP}-{}", w.members[i].name);
                let _ = leases.delete(&name, &DeleteParams::default()).await;
            }
        }
        Fault::DeleteCoordinatorLease => {
            let leases: Api<Lease> = Api::namespaced(w.server.client("admin"), CP_NS);
            let _ = leases
                .delete(&format!("{GROUP}-coordinator"), &DeleteParams::default())
                .await;
        }
        Fault::SlowHandoff { member, ms, leave } => {
            if let Some(i) = pick(w, member) {
                late_writes(w, i, ms);
                bump_all(w).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                if leave {
                    self::leave(w, Some(i));
                } else {
                    let n = w.fresh_name();
                    w.spawn(&n);
                }
                // changes right after the handoff: the new owners' watches move past their barrier
                // LISTs at once, so they act while the old owner's requests may still be in flight
                for _ in 0..4 {
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    bump_all(w).await;
                }
            }
        }
        Fault::LaggingJoin { secs } => lagging_join(w, secs).await,
        Fault::StaleAssignment => stale_assignment(w).await,
        Fault::DeleteLeaseUnderLoad { member, ms } => {
            if let Some(i) = pick(w, member) {
                late_writes(w, i, ms);
                bump_all(w).await;
                let leases: Api<Lease> = Api::namespaced(w.server.client("admin"), CP_NS);
                let name = format!("{GROUP}-{}", w.members[i].name);
                let _ = leases.delete(&name, &DeleteParams::default()).await;
            }
        }
        Fault::GateSkew {
            secs,
            per_connection,
        } => {
            faults.gate_skew(if per_connection {
                GateSkew::PerConnection
            } else {
                GateSkew::PerRequest
            });
            later(Duration::from_secs(secs), move || {
                faults.gate_skew(GateSkew::None)
            });
        }
        Fault::UnfilteredWatch { secs } => {
            faults.unfiltered_watch(PLURAL, true);
            later(Duration::from_secs(secs), move || {
                faults.unfiltered_watch(PLURAL, false)
            });
        }
        Fault::AnotherS { secs } => {
            let n = w.fresh_name();
            let other = ShardCount::new(shards().get() * 2).expect("a valid shard count");
            w.spawn_with(&n, other);
            let sw = w.members[w.members.len() - 1].switch.clone();
            later(Duration::from_secs(secs), move || sw.kill());
        }
        Fault::RestoreAssignment { member, kill } => {
            if restore_after_moves(w).await {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let i = pick(w, member);
                if kill {
                    self::kill(w, i);
                } else {
                    leave(w, i);
                }
            }
        }
        Fault::ReapplyAssignment { rolling } => {
            if restore_after_moves(w).await {
                tokio::time::sleep(Duration::from_millis(500)).await;
                reapply(w, rolling).await;
            }
        }
        Fault::CliEditAfterRestore {
            member,
            shard,
            drain,
        } => {
            if restore_after_moves(w).await {
                if let Some(i) = pick(w, member) {
                    let name = w.members[i].name.clone();
                    let edit = if drain {
                        CliEdit::Drain(name)
                    } else {
                        CliEdit::Pin(shard, name)
                    };
                    let r = cli_edit(w, &edit).await;
                    w.note(format!("cli edit {edit:?}: {r:?}"));
                }
            }
        }
        Fault::SlowApi {
            ms,
            secs,
            member,
            commits,
        } => slow_api(w, ms, secs, member, commits).await,
        Fault::BlackholeRead { member, hold, kill } => blackhole_read(w, member, hold, kill).await,
        Fault::FenceKeySkew { shard, hours } => fence_key_skew(w, shard, hours).await,
        Fault::WallJump { member, secs } => {
            if let Some(i) = pick(w, member) {
                w.members[i]
                    .wall_offset
                    .fetch_add(secs.saturating_mul(1_000), Ordering::SeqCst);
            }
        }
    }
}

/// The targets of member `i`'s fenced writes in the Widget namespace (creates, replaces, patches).
fn write_targets(w: &World, i: usize) -> Vec<Target> {
    [Verb::Create, Verb::Update, Verb::Patch]
        .into_iter()
        .map(|v| {
            Scope::identity(w.members[i].name.clone())
                .verb(v)
                .namespace(NS)
        })
        .collect()
}

/// Member `i`'s fenced writes commit `ms` late and are never answered, for 8 s.
fn late_writes(w: &World, i: usize, ms: u64) {
    let faults = w.server.faults();
    let targets = write_targets(w, i);
    for t in &targets {
        faults.late_commit(t.clone(), Duration::from_millis(ms));
    }
    later(Duration::from_secs(8), move || {
        for t in targets {
            faults.answer_normally(t);
        }
    });
}

/// The writer changes every Widget's spec (a rollout): every owner has reconciles queued.
async fn bump_all(w: &World) {
    let api: Api<Widget> = Api::namespaced(w.server.client("writer"), NS);
    let names: Vec<String> = w
        .server
        .objects("example.kube-shard.io", "widgets")
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    let size = w.now_ms();
    for n in names {
        let patch = serde_json::json!({"spec": {"size": size}});
        let _ = api
            .patch(&n, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
    }
}

/// A new member whose Widget watches freeze for `secs` (after their first LIST), while every Widget
/// changes every 200 ms.
async fn lagging_join(w: &mut World, secs: u64) {
    let n = w.fresh_name();
    w.spawn(&n);
    let faults = w.server.faults();
    let target = Scope::identity(n.clone())
        .verb(Verb::Watch)
        .resource("widgets");
    faults.freeze_watches(target.clone(), true);
    // its Lease writes (the warm acks) take 400 ms: each move stays in Moving — the old owner serving,
    // the new one's LIST done — while changes land
    let acks = Scope::identity(n).verb(Verb::Update).resource("leases");
    faults.latency(acks.clone(), Some(Duration::from_millis(400)));
    // changes every 200 ms: some land while its moves are in Moving (after its LIST, before the
    // release), so the old owner writes a newer spec its frozen cache never sees
    for _ in 0..secs.min(6) * 5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        bump_all(w).await;
    }
    let rest = secs.saturating_sub(secs.min(6));
    later(Duration::from_secs(rest), move || {
        faults.freeze_watches(target, false);
        faults.latency(acks, None);
    });
}

/// Rewrite the assignment as a restored backup would be: its owners, every epoch one lower, at a higher
/// generation.
async fn stale_assignment(w: &World) {
    let cms: Api<ConfigMap> = Api::namespaced(w.server.client("admin"), CP_NS);
    let name = format!("{GROUP}-assignment");
    let Ok(cm) = cms.get(&name).await else {
        return;
    };
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(DATA_KEY)) else {
        return;
    };
    let Ok(mut a) = Assignment::decode(text, shards(), ShardKey::Uid) else {
        return;
    };
    a.view.generation += 1;
    for sa in a.view.shards.values_mut() {
        sa.epoch = sa.epoch.saturating_sub(1).max(1);
    }
    let patch = serde_json::json!({"data": {DATA_KEY: a.encode()}});
    let _ = cms
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
}

/// The identity that writes an older assignment text back (a restored backup, a re-applied manifest).
/// The history oracle does not judge its writes: members ignore a text older than the one they applied.
/// What the members and coordinators do after it is judged.
pub const RESTORER: &str = "backup-restore";

/// The identity of the CLI's edits ([`cli_edit`]): judged like the coordinators' writes.
pub const CLI: &str = "kshard";

fn assignment_name() -> String {
    format!("{GROUP}-assignment")
}

/// The stored assignment: its ConfigMap and decoded text (`None`: absent or undecodable).
async fn read_assignment(api: &Api<ConfigMap>) -> Option<(ConfigMap, String, Assignment)> {
    let cm = api.get_opt(&assignment_name()).await.ok()??;
    let text = cm.data.as_ref()?.get(DATA_KEY)?.clone();
    let a = Assignment::decode(&text, shards(), ShardKey::Uid).ok()?;
    Some((cm, text, a))
}

/// A restored backup of the assignment with owners changed since it was taken: read the text, let a new
/// member join and wait (up to 30 s) until some shard's owner differs from the text and no move is in
/// flight, then write the old text back at its old generation as [`RESTORER`] (a merge patch of the data:
/// no resourceVersion, it replaces whatever is stored). Whether it wrote.
async fn restore_after_moves(w: &mut World) -> bool {
    let admin: Api<ConfigMap> = Api::namespaced(w.server.client("admin"), CP_NS);
    let Some((_, old, before)) = read_assignment(&admin).await else {
        return false;
    };
    let n = w.fresh_name();
    w.spawn(&n);
    let mut moved = false;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Some((_, _, now)) = read_assignment(&admin).await {
            let changed = now
                .view
                .shards
                .iter()
                .any(|(s, a)| before.view.shards.get(s).is_none_or(|b| b.owner != a.owner));
            let stable = now
                .view
                .shards
                .values()
                .all(|a| a.handoff == Handoff::Stable);
            if changed && stable {
                moved = true;
                break;
            }
        }
    }
    w.note(format!(
        "restore generation {} (owners moved since: {moved})",
        before.view.generation
    ));
    let restorer: Api<ConfigMap> = Api::namespaced(w.server.client(RESTORER), CP_NS);
    let patch = serde_json::json!({"data": {DATA_KEY: old}});
    restorer
        .patch(
            &assignment_name(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .is_ok()
}

/// After a write-back: the coordinator's process restarts under its name (a fresh process, no view of its
/// own), and with `rolling` every other member's after it, 2 s apart.
async fn reapply(w: &mut World, rolling: bool) {
    let first = coordinator(w).await;
    let mut order: Vec<usize> = first.into_iter().collect();
    if rolling {
        order.extend(w.live().into_iter().filter(|i| Some(*i) != first));
    }
    for (n, i) in order.into_iter().enumerate() {
        if n > 0 {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        if !w.members[i].alive() {
            continue;
        }
        let name = w.members[i].name.clone();
        kill(w, Some(i));
        w.spawn(&name);
    }
}

/// An edit of the assignment's intent fields, as the CLI makes it.
#[derive(Clone, Debug)]
pub enum CliEdit {
    /// `kshard pin SHARD MEMBER`.
    Pin(u32, String),
    /// `kshard drain MEMBER`.
    Drain(String),
}

/// The CLI's edit of the assignment: the library's (`kube_shard::group::admin`, what `kshard pin` and
/// `kshard drain` call), on the admin's wall clock (the fixed epoch + simulated time). It reads the
/// ConfigMap, refuses over a rolled-back assignment, changes the intent fields of the text read, takes
/// the next generation and replaces conditionally on the resourceVersion read. Returns the generation
/// written.
pub async fn cli_edit(w: &World, edit: &CliEdit) -> Result<u64, String> {
    let group = GroupRef::new(w.server.client(CLI), CP_NS, GROUP).clock(w.admin_clock());
    let edit = match edit {
        CliEdit::Pin(shard, member) => Edit::Pin {
            shard: *shard,
            member: member.clone(),
        },
        CliEdit::Drain(member) => Edit::Drain(member.clone()),
    };
    group
        .edit(edit)
        .await
        .map(|a| a.view.generation)
        .map_err(|e| e.to_string())
}

/// The shards no live process owns (its own state says Owned; members asked to leave count: they serve
/// until they release).
fn uncovered(w: &World) -> Vec<u32> {
    let mut owned = std::collections::BTreeSet::new();
    for m in w.members.iter().filter(|m| m.alive() && !m.foreign) {
        for (s, st) in kube_shard::testing::member_state(&m.handle.ownership()).shards() {
            if matches!(st, ShardState::Owned { .. }) {
                owned.insert(s);
            }
        }
    }
    (0..shards().get()).filter(|s| !owned.contains(s)).collect()
}

/// A liveness judgment while a fault lasts: every shard owned by a live process; else a `stalled`
/// finding saying `what` happened. Skipped while an assignment no member decodes is stored (nothing
/// moves until the heal repairs it, by design).
fn expect_covered(w: &mut World, what: &str) {
    if w.undecodable {
        return;
    }
    let missing = uncovered(w);
    if missing.is_empty() {
        w.note(format!("covered: {what}"));
        return;
    }
    let coordinators: Vec<String> = w
        .live()
        .into_iter()
        .filter(|&i| w.members[i].handle.status().coordinator)
        .map(|i| w.members[i].name.clone())
        .collect();
    let detail = format!(
        "{what}: shards {missing:?} owned by no live member; coordinator: {coordinators:?}"
    );
    w.note(format!("stalled: {detail}"));
    w.findings.push(Finding {
        kind: "stalled".into(),
        detail,
    });
}

/// Every request of every member (or of one) delayed by `ms` for `secs` — before it is handled, or
/// (`commits`) handled at once and answered late — and a member killed a second in. With every member
/// slow inside the band below `renew_deadline − fence_margin` (renewals and fences still work), the dead
/// member's shards must be owned again by the end.
async fn slow_api(w: &mut World, ms: u64, secs: u64, member: Option<usize>, commits: bool) {
    let faults = w.server.faults();
    let target: Target = match member {
        None => Scope::All.into(),
        Some(m) => match pick(w, m) {
            Some(i) => Scope::identity(w.members[i].name.clone()).into(),
            None => return,
        },
    };
    let delay = Some(Duration::from_millis(ms));
    if commits {
        faults.slow_answers(target.clone(), delay);
    } else {
        faults.latency(target.clone(), delay);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // the victim: another member than the slow one, when only one is slow; never the last one alive
    // (with nobody left, nothing can be owned again)
    let victim = (w.live().len() >= 2)
        .then(|| pick(w, member.map_or(secs as usize, |m| m + 1)))
        .flatten();
    let name = victim.map(|i| w.members[i].name.clone());
    kill(w, victim);
    // the bound assumes renewals and fences work; an earlier error burst still failing requests (each
    // now a slow one, so a burst lasts many times longer) breaks that: the clock starts when it is spent
    let mut burst = Duration::ZERO;
    for _ in 1..secs {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if faults.failing() {
            burst += Duration::from_secs(1);
        }
    }
    if !burst.is_zero() {
        w.note(format!(
            "slow api: an error burst failed requests for {} s more",
            burst.as_secs()
        ));
        tokio::time::sleep(burst).await;
    }
    let band_top = u64::try_from(RENEW.saturating_sub(MARGIN).as_millis()).unwrap_or(u64::MAX);
    if member.is_none() && ms < band_top && !faults.failing() {
        if let Some(name) = name {
            expect_covered(
                w,
                &format!(
                    "{} s after {name} died{}, every answer {ms} ms late ({})",
                    secs.saturating_sub(1) + burst.as_secs(),
                    if burst.is_zero() {
                        String::new()
                    } else {
                        format!(" ({} s of them an error burst)", burst.as_secs())
                    },
                    if commits {
                        "handled at once"
                    } else {
                        "handled late"
                    }
                ),
            );
        }
    }
    if commits {
        faults.slow_answers(target, None);
    } else {
        faults.latency(target, None);
    }
}

/// Black-hole member `member`'s Widget LISTs and watch starts for `hold` seconds (each request sent
/// meanwhile waits an hour: never answered in a run), and kill (or make leave) another member so it gets
/// shards it must start reading. `hold + 40 s` after, every shard must be owned again.
async fn blackhole_read(w: &mut World, member: usize, hold: u64, kill: bool) {
    let Some(i) = pick(w, member) else {
        return;
    };
    let live = w.live();
    let Some(pos) = live.iter().position(|&j| j == i) else {
        return;
    };
    let victim = (live.len() > 1).then(|| live[(pos + 1) % live.len()]);
    let faults = w.server.faults();
    let name = w.members[i].name.clone();
    let targets: Vec<Target> = [Verb::List, Verb::Watch]
        .into_iter()
        .map(|v| Scope::identity(name.clone()).verb(v).resource(PLURAL))
        .collect();
    for t in &targets {
        faults.latency(t.clone(), Some(Duration::from_secs(3_600)));
    }
    let gone = victim.map(|v| w.members[v].name.clone());
    if kill {
        self::kill(w, victim);
    } else {
        leave(w, victim);
    }
    later(Duration::from_secs(hold), move || {
        for t in targets {
            faults.latency(t, None);
        }
    });
    tokio::time::sleep(Duration::from_secs(hold + 40)).await;
    if let Some(gone) = gone {
        expect_covered(
            w,
            &format!(
                "{} s after {gone} {} while {name}'s Widget LISTs and watch starts were black-holed for {hold} s",
                hold + 40,
                if kill { "died" } else { "left" }
            ),
        );
    }
}

/// An admin sets shard `shard`'s fence-parameter key `hours` above its committed epoch (or above the key,
/// if that is higher). Three lease periods later no member may refuse the assignment (a re-grant that
/// climbed out of the members' reach would freeze the group), and the key must be reached — the shard
/// re-granted above it — or named by the coordinator's `FenceKeyOutOfReach` alarm; then the admin
/// corrects it to the shard's epoch, as the alarm asks.
async fn fence_key_skew(w: &mut World, shard: u32, hours: u64) {
    let admin: Api<ConfigMap> = Api::namespaced(w.server.client("admin"), CP_NS);
    let epoch_now = |admin: Api<ConfigMap>| async move {
        read_assignment(&admin)
            .await
            .and_then(|(_, _, a)| a.view.shards.get(&shard).map(|s| s.epoch))
            .unwrap_or(0)
    };
    let epoch = epoch_now(admin.clone()).await;
    let key = read_key(&admin, shard).await.unwrap_or(0);
    let value = epoch.max(key) + hours * 3_600_000;
    let patch = serde_json::json!({"data": {shard.to_string(): value.to_string()}});
    let r = admin
        .patch(FENCE_PARAMS, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    w.note(format!(
        "fence key {shard} set to {value} (epoch {epoch}, key {key}): {}",
        if r.is_ok() { "written" } else { "not written" }
    ));
    if r.is_err() {
        return;
    }
    // three lease periods, up to ten when the group is busy with other faults (a coordinator change)
    for _ in 0..10 {
        tokio::time::sleep(crate::world::LEASE).await;
        if epoch_now(admin.clone()).await >= value || out_of_reach_alarmed(w, shard, value).await {
            break;
        }
    }
    if w.undecodable {
        // an assignment no member decodes is stored (another fault): refusing it is by design, and no
        // coordinator writes over it; nothing here to judge, and the heal corrects the key
        w.skewed_keys.push((shard, value, epoch.max(key)));
        return;
    }
    for i in w.live() {
        if let Some(why) = w.members[i].handle.health().assignment_refused() {
            let detail = format!(
                "{} refuses the assignment 3 leases after fence key {shard} was set {hours} h ahead: {why}",
                w.members[i].name
            );
            w.note(format!("frozen: {detail}"));
            w.findings.push(Finding {
                kind: "frozen".into(),
                detail,
            });
        }
    }
    let epoch = epoch_now(admin.clone()).await;
    if epoch >= value {
        w.note(format!(
            "fence key {shard}: re-granted at {epoch}, above the key"
        ));
        return;
    }
    let coordinated = w
        .live()
        .into_iter()
        .any(|i| w.members[i].handle.status().coordinator);
    if !coordinated && !out_of_reach_alarmed(w, shard, value).await {
        // other faults left the group without a coordinator meanwhile: nobody could read the key
        w.note(format!(
            "fence key {shard}: no coordinator to judge it; the heal puts it back"
        ));
        w.skewed_keys.push((shard, value, epoch.max(key)));
        return;
    }
    if !out_of_reach_alarmed(w, shard, value).await {
        let detail = format!(
            "fence key {shard} = {value} is still above its shard's epoch {epoch} 3 leases later, and no alarm names it"
        );
        w.note(format!("stalled: {detail}"));
        w.findings.push(Finding {
            kind: "stalled".into(),
            detail,
        });
        return;
    }
    // the admin follows the alarm: the key back to the shard's epoch (never below it)
    let patch = serde_json::json!({"data": {shard.to_string(): epoch.to_string()}});
    let r = admin
        .patch(FENCE_PARAMS, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    w.note(format!(
        "fence key {shard}: alarmed; the admin set it back to epoch {epoch}: {}",
        if r.is_ok() { "written" } else { "not written" }
    ));
}

/// The coordinator's `FenceKeyOutOfReach` Event names `shard`'s key at `value`.
async fn out_of_reach_alarmed(w: &World, shard: u32, value: u64) -> bool {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(w.server.client("admin"), CP_NS);
    let named = format!("\"{shard}\" = {value}");
    events
        .list(&Default::default())
        .await
        .map(|l| {
            l.items.iter().any(|e| {
                e.reason.as_deref() == Some("FenceKeyOutOfReach")
                    && e.note.as_deref().is_some_and(|m| m.contains(&named))
            })
        })
        .unwrap_or(false)
}

async fn read_key(admin: &Api<ConfigMap>, shard: u32) -> Option<u64> {
    admin
        .get_opt(FENCE_PARAMS)
        .await
        .ok()
        .flatten()
        .and_then(|c| c.data?.get(&shard.to_string())?.parse::<u64>().ok())
}

fn kill(w: &mut World, i: Option<usize>) {
    if let Some(i) = i {
        w.note(format!("kill {}", w.members[i].name));
        w.members[i].switch.kill();
    }
}

fn leave(w: &mut World, i: Option<usize>) {
    if let Some(i) = i {
        w.members[i].leaving = true;
        w.members[i].handle.leave();
    }
}

/// Undo every lasting fault: the faults switched off, a member configured with another `S` (another-s)
/// stopped, every member resumed, wall clocks back in step, and an assignment no member decodes deleted.
/// That last one is the admin's repair: by design no coordinator writes over an assignment it cannot
/// decode (it could be a newer format), so until someone repairs it nothing moves — a member that was
/// leaving stays, and its name's successor waits for it. The misconfigured member goes first: left
/// running, it could be the only member when the assignment is deleted, and would re-create it for its
/// own `S`, which the group's members refuse for good (nothing tells it the group's `S`).
pub async fn heal(w: &World) {
    w.server.faults().clear();
    for m in w.members.iter().filter(|m| m.foreign && m.alive()) {
        w.note(format!("heal: stop {} (another S)", m.name));
        m.switch.kill();
    }
    let cms: Api<ConfigMap> = Api::namespaced(w.server.client("admin"), CP_NS);
    let name = format!("{GROUP}-assignment");
    if let Ok(Some(cm)) = cms.get_opt(&name).await {
        let text = cm.data.as_ref().and_then(|d| d.get(DATA_KEY));
        if text.is_none_or(|t| Assignment::decode(t, shards(), ShardKey::Uid).is_err()) {
            let _ = cms.delete(&name, &DeleteParams::default()).await;
            w.note("heal: deleted the assignment no member decodes");
        }
    }
    for m in &w.members {
        m.switch.set_frozen(false);
        m.wall_offset.store(0, Ordering::SeqCst);
    }
    // a fence key set far ahead while nothing could be judged: the admin puts it back, as the alarm asks
    for &(shard, set, before) in w.skewed_keys.iter().rev() {
        if read_key(&cms, shard).await == Some(set) {
            let patch = serde_json::json!({"data": {shard.to_string(): before.to_string()}});
            let r = cms
                .patch(FENCE_PARAMS, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            w.note(format!(
                "heal: fence key {shard} back to {before}: {}",
                match r {
                    Ok(_) => "written".to_owned(),
                    Err(e) => format!("not written ({e})"),
                }
            ));
        }
    }
    w.note("heal");
}

/// Create `n` Widgets `w-0 … w-{n-1}`.
pub async fn seed_widgets(w: &World, n: usize) {
    let api: Api<Widget> = Api::namespaced(w.server.client("writer"), NS);
    for i in 0..n {
        let _ = api
            .create(&PostParams::default(), &widget(&format!("w-{i}"), 0))
            .await;
    }
}

fn widget(name: &str, size: i64) -> Widget {
    Widget::new(
        name,
        NS,
        WidgetSpec {
            size: Some(size),
            ..WidgetSpec::default()
        },
    )
}

/// One writer step: a spec change, a create, a delete, or a delete + re-create under one name (at most
/// `max` Widgets). Errors (faults) are ignored: the writer is a user, not a checked party.
pub async fn write_step(w: &World, rng: &mut Rng, max: usize) {
    let api: Api<Widget> = Api::namespaced(w.server.client("writer"), NS);
    let names: Vec<String> = w
        .server
        .objects("example.kube-shard.io", "widgets")
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    let Some(name) = rng.pick(&names).cloned() else {
        return;
    };
    match rng.range(0, 9) {
        0..=5 => {
            let patch = serde_json::json!({"spec": {"size": rng.range(0, 1_000_000)}});
            let _ = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
        }
        6 if names.len() < max => {
            let n = format!("w-x{}", rng.range(0, 1_000_000));
            let _ = api.create(&PostParams::default(), &widget(&n, 1)).await;
        }
        7 => {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
        _ => {
            if api.delete(&name, &DeleteParams::default()).await.is_ok() {
                let _ = api.create(&PostParams::default(), &widget(&name, 2)).await;
            }
        }
    }
}
