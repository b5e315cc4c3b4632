//! What a real cluster holds besides the demo's own objects, and the checks that the HA contract leaves it
//! alone. Before the mirror starts, each cluster gets what its kube-controller-manager would make in the
//! demo's namespace — a `kube-root-ca.crt` ConfigMap with that cluster's CA and a `default`
//! ServiceAccount — and a ConfigMap another tool owns (`helm-release`, unlabelled), each with that
//! cluster's own content; the Active gets the operator's labelled ConfigMaps (`settings-*`). The mirror
//! copies ConfigMaps too, scoped by the demo's label: the labelled ones reach the other side, the others
//! are never copied, paired, deleted at failback or refused by the switchover freeze.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::{ObjectMeta, PostParams};
use kube::Api;

use super::setup::Cluster;
use crate::demo::DemoError;
use kube_shard_ha::switchover::FREEZE_MARK;

/// The demo's scope label: the mirror copies, and the freeze covers, only what carries it.
pub(crate) const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "kshard-demo");
/// The label selector of [`PART_OF`].
pub(crate) fn selector() -> String {
    format!("{}={}", PART_OF.0, PART_OF.1)
}
/// The labels of [`PART_OF`].
pub(crate) fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([(PART_OF.0.to_owned(), PART_OF.1.to_owned())])
}

/// The operator's labelled ConfigMaps the Active starts with.
const SETTINGS: usize = 3;

fn cm(name: &str, ns: &str, value: &str, labelled: bool) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(ns.to_owned()),
            labels: labelled.then(labels),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("v".to_owned(), value.to_owned())])),
        ..ConfigMap::default()
    }
}

async fn create<K>(api: &Api<K>, obj: &K) -> Result<(), DemoError>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(DemoError::failed(format!(
            "creating {:?}: {e}",
            obj.meta().name
        ))),
    }
}

/// The content of each cluster's own ConfigMaps as they were before the mirror started:
/// (cluster, name) → data.
pub(crate) type Kept = BTreeMap<(String, String), Option<BTreeMap<String, String>>>;

/// Create on `c` what its controller manager and another tool would hold in `ns` (a real cluster's
/// controller manager may have made `kube-root-ca.crt` and `default` already: kept as they are), and on
/// the Active the operator's labelled ConfigMaps; record the own ConfigMaps' content in `kept`.
pub(crate) async fn make(
    c: &Cluster,
    ns: &str,
    active: bool,
    kept: &mut Kept,
) -> Result<(), DemoError> {
    let client = c.client("kube-controller-manager");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    create(&cms, &cm("kube-root-ca.crt", ns, &ca(c.id), false)).await?;
    create(&cms, &cm("helm-release", ns, &owner(c.id), false)).await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client, ns);
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("default".into()),
            namespace: Some(ns.to_owned()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    create(&sas, &sa).await?;
    if active {
        for i in 0..SETTINGS {
            create(
                &cms,
                &cm(&format!("settings-{i}"), ns, &format!("{i}"), true),
            )
            .await?;
        }
    }
    for name in OWN {
        let now = cms
            .get(name)
            .await
            .map_err(|e| DemoError::failed(format!("reading {name} on {}: {e}", c.id)))?;
        kept.insert((c.id.to_owned(), name.to_owned()), now.data);
    }
    Ok(())
}

/// Each cluster's own ConfigMaps: its controller manager's and another tool's.
const OWN: [&str; 2] = ["kube-root-ca.crt", "helm-release"];

fn ca(id: &str) -> String {
    format!("the CA of cluster {id}")
}

fn owner(id: &str) -> String {
    format!("helm on cluster {id}")
}

/// Every object each cluster holds for itself still has the content it had before the mirror started
/// (`kept`), and the operator's labelled ConfigMaps are on both sides with the same content: the
/// failures.
pub(crate) async fn check(a: &Cluster, b: &Cluster, ns: &str, kept: &Kept) -> Vec<String> {
    let mut f = Vec::new();
    let mut settings = Vec::new();
    for c in [a, b] {
        let cms: Api<ConfigMap> = Api::namespaced(c.client("demo-oracle"), ns);
        for name in OWN {
            let want = kept.get(&(c.id.to_owned(), name.to_owned()));
            match cms.get_opt(name).await {
                Ok(Some(m)) if Some(&m.data) == want => {}
                Ok(Some(m)) => f.push(format!(
                    "{}: {name} was changed by the HA contract: {:?} (was {want:?})",
                    c.id, m.data
                )),
                Ok(None) => f.push(format!("{}: {name} was deleted", c.id)),
                Err(e) => f.push(format!("{}: reading {name}: {e}", c.id)),
            }
        }
        let sas: Api<ServiceAccount> = Api::namespaced(c.client("demo-oracle"), ns);
        if !matches!(sas.get_opt("default").await, Ok(Some(_))) {
            f.push(format!("{}: the default ServiceAccount is gone", c.id));
        }
        let mut held = BTreeMap::new();
        for i in 0..SETTINGS {
            let name = format!("settings-{i}");
            if let Ok(Some(m)) = cms.get_opt(&name).await {
                held.insert(name, value(&m).map(str::to_owned));
            }
        }
        settings.push(held);
    }
    if settings[0].len() != SETTINGS || settings[0] != settings[1] {
        f.push(format!(
            "the labelled ConfigMaps differ: a {:?}, b {:?}",
            settings[0], settings[1]
        ));
    }
    f
}

fn value(m: &ConfigMap) -> Option<&str> {
    m.data.as_ref()?.get("v").map(String::as_str)
}

/// On `frozen` (an old Active after a switchover): what its controllers and other tools write is
/// accepted (dry-run updates of `kube-root-ca.crt` and `helm-release`), while a write of the mirrored
/// scope (a labelled ConfigMap) is refused by the freeze: the failures.
pub(crate) async fn freeze_scope(frozen: &Cluster, ns: &str) -> Vec<String> {
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut f = Vec::new();
    for (who, name, refused) in [
        ("kube-controller-manager", "kube-root-ca.crt", false),
        ("helm", "helm-release", false),
        ("writer", "settings-0", true),
    ] {
        let api: Api<ConfigMap> = Api::namespaced(frozen.client(who), ns);
        let cur = match api.get(name).await {
            Ok(c) => c,
            Err(e) => {
                f.push(format!("{}: reading {name}: {e}", frozen.id));
                continue;
            }
        };
        match (api.replace(name, &dry, &cur).await, refused) {
            (Ok(_), false) => {}
            (Err(kube::Error::Api(s)), true) if s.message.contains(FREEZE_MARK) => {}
            (r, _) => f.push(format!(
                "{}: the freeze {} a write of {name} by {who}: {:?}",
                frozen.id,
                if refused { "did not refuse" } else { "refused" },
                r.map(|_| "accepted")
            )),
        }
    }
    f
}
