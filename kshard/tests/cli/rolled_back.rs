//! `kshard pin|unpin|pause|resume|drain|undrain` write over the stored assignment, so they must never edit a
//! rolled-back one (a restored backup, a re-applied manifest): members would follow the edit's newer
//! generation back to the old owners. The CLI reads the group's live member reports first.

use std::collections::BTreeMap;
use std::process::Command;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube_shard::group::assignment::{Assignment, DATA_KEY};
use kube_shard::group::report::{MemberReport, GROUP_LABEL, INCARNATION, REPORT, ROLE_LABEL};
use kube_shard::{ShardCount, ShardKey};

use crate::status::{client_for, testserver};

fn now_ms() -> u64 {
    u64::try_from(k8s_openapi::jiff::Timestamp::now().as_millisecond()).unwrap()
}

/// A member Lease of group `g`, renewed now, whose report says it applied `applied`.
fn member_lease(name: &str, applied: u64) -> Lease {
    let mut report = MemberReport::default();
    report.ready = true;
    report.weight = 1;
    report.applied_generation = applied;
    report.seen_generation = applied;
    Lease {
        metadata: ObjectMeta {
            name: Some(format!("g-{name}")),
            labels: Some(BTreeMap::from([
                (GROUP_LABEL.to_owned(), "g".to_owned()),
                (ROLE_LABEL.to_owned(), "member".to_owned()),
            ])),
            annotations: Some(BTreeMap::from([
                (INCARNATION.to_owned(), "0123456789abcdef".to_owned()),
                (REPORT.to_owned(), report.encode()),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_owned()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..LeaseSpec::default()
        }),
    }
}

fn pin(kc: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args(["pin", "3", "m1", "--kubeconfig"])
        .arg(kc)
        .args(["-n", "default", "--group", "g"])
        .output()
        .unwrap()
}

/// While a live member reports a generation applied above the stored assignment's, `kshard pin` refuses
/// with the coordinator's alarm text and writes nothing; once no live member is ahead, the same edit is
/// written at a newer generation.
#[test]
fn an_edit_of_a_rolled_back_assignment_is_refused_while_a_live_member_is_ahead() {
    let (dir, _server) = testserver();
    let kc = dir.path().join("kubeconfig");
    let (rt, client) = client_for(&kc);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let leases: Api<Lease> = Api::namespaced(client, "default");

    let stored = now_ms() - 60_000;
    let mut a = Assignment::empty(ShardCount::new(16).unwrap(), ShardKey::Uid);
    a.view.generation = stored;
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("g-assignment".into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(DATA_KEY.to_owned(), a.encode())])),
        ..ConfigMap::default()
    };
    rt.block_on(cms.create(&PostParams::default(), &cm))
        .unwrap();
    let ahead = stored + 30_000;
    rt.block_on(leases.create(&PostParams::default(), &member_lease("m1", ahead)))
        .unwrap();
    let before = rt.block_on(cms.get("g-assignment")).unwrap();

    let out = pin(&kc);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused: {stderr}");
    assert!(
        stderr.contains(&format!(
            "the stored assignment (generation {stored}) is older than generation {ahead} that g-m1 applied"
        )),
        "{stderr}"
    );
    let after = rt.block_on(cms.get("g-assignment")).unwrap();
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "nothing written"
    );

    // the member caught up (the coordinator wrote over the restore): the edit goes through
    let mut l = rt.block_on(leases.get("g-m1")).unwrap();
    l.metadata.annotations = member_lease("m1", stored).metadata.annotations;
    rt.block_on(leases.replace("g-m1", &PostParams::default(), &l))
        .unwrap();
    let out = pin(&kc);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = rt.block_on(cms.get("g-assignment")).unwrap().data.unwrap()[DATA_KEY].clone();
    let edited = Assignment::decode(&text, ShardCount::new(16).unwrap(), ShardKey::Uid).unwrap();
    assert!(edited.view.generation > stored);
    assert_eq!(edited.pins.get(&3).map(String::as_str), Some("m1"));
}
