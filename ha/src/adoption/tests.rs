//! The adoption plan and failback pairing (pure).

use std::collections::BTreeMap;

use kube::api::DynamicObject;
use proptest::prelude::*;
use serde_json::json;

use super::pairing::{pair, Pairing};
use super::plan::{apply_restore, plan_promotion, CopyView, Propagation, ShardSpec, Step};
use crate::mirror::plan::{
    plan as plan_copy, CopyContext, MIRRORED_FROM, SHARD_LABEL, SOURCE_DELETING, SOURCE_FINALIZERS,
    SOURCE_OWNERS, SOURCE_SHARD, SOURCE_UID,
};
use crate::mirror::rv::SourceId;
use kube_shard::hash::ShardKey;
use kube_shard::shard::ShardCount;
use kube_shard::token::FENCE_ANNOTATION;

fn owner(name: &str, src_uid: &str, controller: bool) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": src_uid, "controller": controller})
}

/// A copy of source object `n` (source uid `s-<n>`, copy uid `c-<n>`).
fn copy(
    n: &str,
    owners: &[serde_json::Value],
    fins: &[&str],
    deleting: bool,
    shard: bool,
) -> DynamicObject {
    let mut ann = serde_json::Map::new();
    ann.insert(SOURCE_UID.into(), json!(format!("s-{n}")));
    ann.insert(FENCE_ANNOTATION.into(), json!("2001:mirror"));
    if !owners.is_empty() {
        ann.insert(
            SOURCE_OWNERS.into(),
            json!(serde_json::to_string(owners).unwrap()),
        );
    }
    if !fins.is_empty() {
        ann.insert(
            SOURCE_FINALIZERS.into(),
            json!(serde_json::to_string(fins).unwrap()),
        );
    }
    if deleting {
        ann.insert(SOURCE_DELETING.into(), json!("2026-01-01T00:00:00Z"));
    }
    if shard {
        ann.insert(SOURCE_SHARD.into(), json!("3"));
    }
    serde_json::from_value(json!({
        "metadata": {"name": n, "namespace": "apps", "uid": format!("c-{n}"), "resourceVersion": "7",
                     "labels": {MIRRORED_FROM: "a"}, "annotations": ann},
        "data": {"k": n}
    }))
    .unwrap()
}

fn views(objs: &[DynamicObject]) -> Vec<CopyView> {
    objs.iter()
        .map(|o| CopyView::read("configmaps", o, "a").unwrap().unwrap())
        .collect()
}

fn restores(p: &super::plan::PromotionPlan) -> Vec<&super::plan::Restore> {
    p.steps
        .iter()
        .filter_map(|s| match s {
            Step::Restore(r) => Some(r),
            Step::Delete(_) => None,
        })
        .collect()
}

#[test]
fn a_child_listed_before_its_owner_is_restored_after_it_with_the_owner_copy_uid() {
    let objs = [
        copy(
            "child",
            &[owner("parent", "s-parent", true)],
            &[],
            false,
            true,
        ),
        copy("parent", &[], &["example.com/cleanup"], false, false),
    ];
    let spec = ShardSpec {
        key: ShardKey::Uid,
        count: ShardCount::new(16).unwrap(),
    };
    let p = plan_promotion(&views(&objs), 3002, Some(spec));
    assert!(p.problems.is_empty(), "{:?}", p.problems);
    let r = restores(&p);
    assert_eq!(
        r.iter().map(|r| r.at.name.as_str()).collect::<Vec<_>>(),
        ["parent", "child"]
    );
    assert_eq!(r[0].finalizers, ["example.com/cleanup"]);
    assert_eq!(
        r[1].owners[0].uid, "c-parent",
        "remapped to the owner copy's uid"
    );
    let parent_meta = &objs[1].metadata;
    let want = spec
        .count
        .shard_of(ShardKey::Uid.hash_meta(parent_meta).unwrap());
    assert_eq!(
        r[1].shard,
        Some(want),
        "the child's shard is its owner copy's"
    );
    assert_eq!(r[1].fence.as_deref(), Some("3002:mirror"));
}

#[test]
fn a_terminating_source_restores_finalizers_then_deletes_with_its_propagation() {
    let objs = [
        copy("w", &[], &["example.com/cleanup", "orphan"], true, false),
        copy("x", &[], &[], true, false),
    ];
    let p = plan_promotion(&views(&objs), 3002, None);
    let last: Vec<&Step> = p.steps.iter().skip(2).collect();
    assert!(matches!(p.steps[0], Step::Restore(ref r) if r.finalizers == ["example.com/cleanup"]));
    assert!(
        matches!(last[0], Step::Delete(d) if d.at.name == "w" && d.propagation == Propagation::Orphan && d.uid == "c-w")
    );
    assert!(
        matches!(last[1], Step::Delete(d) if d.at.name == "x" && d.propagation == Propagation::Background)
    );
}

#[test]
fn an_unmirrored_owner_and_an_unconfigured_shard_key_are_reported() {
    let objs = [copy(
        "c",
        &[owner("gone", "s-gone", true)],
        &[],
        false,
        true,
    )];
    let p = plan_promotion(&views(&objs), 3002, None);
    assert_eq!(p.problems.len(), 2, "{:?}", p.problems);
    let r = restores(&p);
    assert!(
        r[0].owners.is_empty(),
        "a dangling uid would let the GC delete the copy"
    );
    assert_eq!(r[0].shard, None);
}

#[test]
fn a_plain_copy_needs_no_write_before_admission_and_foreign_objects_are_not_copies() {
    let p = plan_promotion(&views(&[copy("p", &[], &[], false, false)]), 3002, None);
    assert!(p.steps.is_empty());
    let mut other = copy("o", &[], &[], false, false);
    other.metadata.labels = Some(BTreeMap::from([(MIRRORED_FROM.into(), "z".into())]));
    assert_eq!(CopyView::read("configmaps", &other, "a"), Ok(None));
    let mut bad = copy("b", &[], &[], false, false);
    bad.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(SOURCE_OWNERS.into(), "{".into());
    assert!(CopyView::read("configmaps", &bad, "a").is_err());
}

#[test]
fn an_ownership_cycle_is_reported_and_every_copy_still_restored() {
    let objs = [
        copy("x", &[owner("y", "s-y", false)], &[], false, false),
        copy("y", &[owner("x", "s-x", false)], &[], false, false),
    ];
    let p = plan_promotion(&views(&objs), 3002, None);
    assert_eq!(restores(&p).len(), 2);
    assert_eq!(p.problems.len(), 1);
}

/// A forest: object i's owner (if any) is some j < i; the list is shuffled by `perm`.
fn forest() -> impl Strategy<Value = (Vec<Option<usize>>, Vec<bool>, Vec<bool>, Vec<usize>)> {
    (1usize..12).prop_flat_map(|n| {
        let owners = (0..n)
            .map(|i| {
                if i == 0 {
                    Just(None).boxed()
                } else {
                    proptest::option::of(0..i).boxed()
                }
            })
            .collect::<Vec<_>>();
        (
            owners,
            proptest::collection::vec(any::<bool>(), n),
            proptest::collection::vec(any::<bool>(), n),
            Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
        )
    })
}

proptest! {
    #[test]
    fn owners_first_remapped_deletes_last_and_idempotent((owners, fins, del, perm) in forest()) {
        let objs: Vec<DynamicObject> = perm.iter().map(|&i| {
            let o: Vec<_> = owners[i].iter().map(|j| owner(&format!("o{j}"), &format!("s-o{j}"), true)).collect();
            let f: &[&str] = if fins[i] { &["example.com/f"] } else { &[] };
            copy(&format!("o{i}"), &o, f, del[i], false)
        }).collect();
        let p = plan_promotion(&views(&objs), 3002, None);
        prop_assert!(p.problems.is_empty());
        let pos: BTreeMap<String, usize> = p.steps.iter().enumerate().filter_map(|(k, s)| match s {
            Step::Restore(r) => Some((r.at.name.clone(), k)),
            Step::Delete(_) => None,
        }).collect();
        let first_delete = p.steps.iter().position(|s| matches!(s, Step::Delete(_))).unwrap_or(p.steps.len());
        prop_assert!(pos.values().all(|&k| k < first_delete), "deletes come after every restore");
        for (i, o) in owners.iter().enumerate() {
            if let Some(j) = o {
                let (ci, cj) = (&pos[&format!("o{i}")], pos.get(&format!("o{j}")));
                if let Some(cj) = cj { prop_assert!(cj < ci, "owner o{j} before o{i}"); }
                let r = restores(&p).into_iter().find(|r| r.at.name == format!("o{i}")).unwrap();
                prop_assert_eq!(&r.owners[0].uid, &format!("c-o{j}"));
            }
        }
        prop_assert_eq!(p.steps.iter().filter(|s| matches!(s, Step::Delete(_))).count(), del.iter().filter(|d| **d).count());
        // run it: restores applied, deleted copies terminating; a second plan writes nothing
        let mut after = objs.clone();
        for o in &mut after {
            for s in &p.steps {
                match s {
                    Step::Restore(r) if Some(&r.uid) == o.metadata.uid.as_ref() => apply_restore(r, &mut o.metadata),
                    Step::Delete(d) if Some(&d.uid) == o.metadata.uid.as_ref() => {
                        o.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
                    }
                    _ => {}
                }
            }
        }
        let again: Vec<CopyView> = after.iter().filter_map(|o| CopyView::read("configmaps", o, "a").unwrap()).collect();
        let p2 = plan_promotion(&again, 3002, None);
        prop_assert!(p2.steps.is_empty(), "{:?}", p2.steps);
    }
}

fn ctx_b() -> CopyContext {
    CopyContext {
        source: SourceId {
            cluster: "b".into(),
            uid: "ks-b".into(),
            resource: "configmaps".into(),
        },
        epoch: 3002,
    }
}

fn native(name: &str, uid: &str, data: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "apps", "uid": uid, "resourceVersion": "40",
                     "finalizers": ["example.com/f"], "labels": {"app": "x"},
                     "annotations": {FENCE_ANNOTATION: "2001:0/1"}},
        "data": {"k": data}
    }))
    .unwrap()
}

/// The new Active's copy-turned-own object for `old`: recorded source uid = old's uid.
fn adopted(old: &DynamicObject, data: &str) -> DynamicObject {
    let mut n = native(old.metadata.name.as_deref().unwrap(), "u-new", data);
    n.metadata.resource_version = Some("900".into());
    n.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(SOURCE_UID.into(), old.metadata.uid.clone().unwrap());
    n.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(FENCE_ANNOTATION.into(), "3002:1/4".into());
    n
}

#[test]
fn failback_pairs_equal_different_and_divergent() {
    let old = native("w", "u-old", "1");
    let k = "configmaps";
    assert!(matches!(
        pair(k, &old, Some(&adopted(&old, "1")), &ctx_b()),
        Ok(Pairing::Label(_))
    ));
    match pair(k, &old, Some(&adopted(&old, "2")), &ctx_b()) {
        Ok(Pairing::Update(p)) => {
            assert_eq!(p.body["data"], json!({"k": "2"}));
            assert_eq!(
                p.meta.annotations.as_ref().unwrap()[FENCE_ANNOTATION],
                "3002:mirror"
            );
            assert_eq!(p.meta.labels.as_ref().unwrap()[MIRRORED_FROM], "b");
            assert!(p.meta.finalizers.is_none());
        }
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(pair(k, &old, None, &ctx_b()), Ok(Pairing::Divergent(d)) if d.uid == "u-old" && d.fence.as_deref() == Some("2001:0/1"))
    );
    // a same-named object on the new Active that is not this one's copy (re-created on either side)
    let stranger = native("w", "u-other", "1");
    assert!(matches!(
        pair(k, &old, Some(&stranger), &ctx_b()),
        Ok(Pairing::Divergent(_))
    ));
    let mut other_copy = adopted(&old, "1");
    other_copy
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(SOURCE_UID.into(), "u-elsewhere".into());
    assert!(matches!(
        pair(k, &old, Some(&other_copy), &ctx_b()),
        Ok(Pairing::Divergent(_))
    ));
    // the copy plan of the new object strips the shard label too
    let mut labelled = adopted(&old, "1");
    labelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(SHARD_LABEL.into(), "4".into());
    assert!(!plan_copy(&labelled, &ctx_b())
        .unwrap()
        .meta
        .labels
        .unwrap()
        .contains_key(SHARD_LABEL));
}
