//! Read-modify-write of the checkpoint ConfigMap (`<name>-ha-mirror` in the HA namespace), retried on
//! conflicts.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::config::{checkpoint_name, HaConfig};

/// A failed read or write of the checkpoint.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
#[non_exhaustive]
pub struct EditError {
    /// What was being done.
    pub what: String,
    /// The error.
    #[source]
    pub source: kube::Error,
}

/// Apply `f` to the data of the checkpoint of the cluster `client` reaches (created when missing).
pub async fn edit_checkpoint(
    client: &Client,
    cfg: &HaConfig,
    f: impl Fn(&mut BTreeMap<String, String>),
) -> Result<(), EditError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &cfg.namespace);
    let name = checkpoint_name(cfg);
    loop {
        let cur = api.get_opt(&name).await.map_err(|source| EditError {
            what: format!("reading {name}"),
            source,
        })?;
        let res = match cur {
            None => {
                let mut data = BTreeMap::new();
                f(&mut data);
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        ..ObjectMeta::default()
                    },
                    data: Some(data),
                    ..ConfigMap::default()
                };
                api.create(&PostParams::default(), &cm).await
            }
            Some(mut cm) => {
                f(cm.data.get_or_insert_with(Default::default));
                api.replace(&name, &PostParams::default(), &cm).await
            }
        };
        match res {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(source) => {
                return Err(EditError {
                    what: format!("writing {name}"),
                    source,
                })
            }
        }
    }
}
