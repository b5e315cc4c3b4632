//! The opt-in "controllers" mode: what kube-controller-manager would do, run synchronously after each
//! commit — garbage collection by `ownerReferences` (background, orphan and foreground propagation) and
//! namespace finalisation. A bare kube-apiserver (the default) runs none of it.

use std::{collections::HashSet, sync::Arc};

use serde_json::{json, Value};

use crate::{
    resources::ResourceInfo,
    rest::{delete_locked, finish_update, remove_finalizer, system_ctx, DeleteOptions, WriteCtx},
    store::{Change, ChangeKind, Store},
};

fn owner_uids(v: &Value) -> Vec<&str> {
    v["metadata"]["ownerReferences"]
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["uid"].as_str()).collect())
        .unwrap_or_default()
}

fn has_finalizer(v: &Value, f: &str) -> bool {
    v["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x == f))
}

fn info_of(store: &Store, store_key: &str) -> Option<Arc<ResourceInfo>> {
    store.registry.by_store_key(store_key)
}

pub(crate) fn after_commit(
    store: &mut Store,
    ctx: &WriteCtx<'_>,
    info: &ResourceInfo,
    change: &Change,
) {
    let sys = system_ctx(ctx.inner);
    let v = &change.obj.value;
    let deleting = v["metadata"].get("deletionTimestamp").is_some();
    if info.builtin && info.plural == "namespaces" && deleting && change.kind != ChangeKind::Deleted
    {
        empty_namespace(store, &sys, change.obj.name());
    }
    if change.kind == ChangeKind::Deleted {
        if !change.obj.namespace.is_empty() {
            finalize_namespace_if_empty(store, &sys, &change.obj.namespace);
        }
        collect_dependents(store, &sys, &change.obj.uid);
        // A foreground owner waiting for this dependent?
        for owner in owner_uids(v) {
            release_foreground(store, &sys, owner);
        }
    } else if deleting {
        if has_finalizer(v, "orphan") {
            orphan_dependents(store, &sys, &change.obj.uid);
            let mut next = v.clone();
            remove_finalizer(&mut next, "orphan");
            if let Some(i) = info_of(store, &change.store_key) {
                if let Some(cur) = store.get(&change.store_key, &change.key) {
                    finish_update(store, &sys, &i, change.key.clone(), &cur, next, None);
                }
            }
        }
        if has_finalizer(v, "foregroundDeletion") {
            for (sk, key, o) in dependents(store, &change.obj.uid) {
                if let Some(i) = info_of(store, &sk) {
                    let _ =
                        delete_locked(store, &sys, &i, key, &o, &DeleteOptions::default(), None);
                }
            }
            release_foreground(store, &sys, &change.obj.uid);
        }
    }
}

fn dependents(store: &Store, uid: &str) -> Vec<(Arc<str>, String, Arc<crate::store::Obj>)> {
    store
        .all_objects()
        .into_iter()
        .filter(|(_, _, o)| owner_uids(&o.value).contains(&uid))
        .collect()
}

fn live_uids(store: &Store) -> HashSet<String> {
    store
        .all_objects()
        .into_iter()
        .map(|(_, _, o)| o.uid.clone())
        .collect()
}

/// Background deletion: dependents all of whose owners are gone are deleted.
fn collect_dependents(store: &mut Store, sys: &WriteCtx<'_>, uid: &str) {
    let deps = dependents(store, uid);
    if deps.is_empty() {
        return;
    }
    let live = live_uids(store);
    for (sk, key, o) in deps {
        if o.value["metadata"].get("deletionTimestamp").is_some() {
            continue;
        }
        if owner_uids(&o.value).iter().all(|u| !live.contains(*u)) {
            if let Some(i) = info_of(store, &sk) {
                let _ = delete_locked(store, sys, &i, key, &o, &DeleteOptions::default(), None);
            }
        }
    }
}

fn orphan_dependents(store: &mut Store, sys: &WriteCtx<'_>, uid: &str) {
    for (sk, key, o) in dependents(store, uid) {
        let mut next = o.value.clone();
        if let Some(refs) = next["metadata"]["ownerReferences"].as_array_mut() {
            refs.retain(|r| r["uid"] != json!(uid));
        }
        if let Some(i) = info_of(store, &sk) {
            finish_update(store, sys, &i, key, &o, next, None);
        }
    }
}

fn release_foreground(store: &mut Store, sys: &WriteCtx<'_>, owner_uid: &str) {
    if !dependents(store, owner_uid).is_empty() {
        return;
    }
    let owner = store
        .all_objects()
        .into_iter()
        .find(|(_, _, o)| o.uid == owner_uid && has_finalizer(&o.value, "foregroundDeletion"));
    if let Some((sk, key, o)) = owner {
        let mut next = o.value.clone();
        remove_finalizer(&mut next, "foregroundDeletion");
        if let Some(i) = info_of(store, &sk) {
            finish_update(store, sys, &i, key, &o, next, None);
        }
    }
}

fn in_namespace(store: &Store, ns: &str) -> Vec<(Arc<str>, String, Arc<crate::store::Obj>)> {
    store
        .all_objects()
        .into_iter()
        .filter(|(_, _, o)| o.namespace == ns)
        .collect()
}

fn empty_namespace(store: &mut Store, sys: &WriteCtx<'_>, ns: &str) {
    for (sk, key, o) in in_namespace(store, ns) {
        if o.value["metadata"].get("deletionTimestamp").is_some() {
            continue;
        }
        if let Some(i) = info_of(store, &sk) {
            let _ = delete_locked(store, sys, &i, key, &o, &DeleteOptions::default(), None);
        }
    }
    finalize_namespace_if_empty(store, sys, ns);
}

fn finalize_namespace_if_empty(store: &mut Store, sys: &WriteCtx<'_>, ns: &str) {
    let Some(nsobj) = store.get("/namespaces", ns) else {
        return;
    };
    if nsobj.value["metadata"].get("deletionTimestamp").is_none()
        || !in_namespace(store, ns).is_empty()
    {
        return;
    }
    let mut next = nsobj.value.clone();
    next["spec"]["finalizers"] = json!([]);
    if let Some(i) = info_of(store, "/namespaces") {
        finish_update(store, sys, &i, ns.to_string(), &nsobj, next, None);
    }
}
