//! KEP-5866 filtering with the gate on and off.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{Api, ListParams, PostParams, WatchEvent, WatchParams},
    core::{DynamicObject, Request},
};
use kube_shard::{fnv1a64, ShardCount, ShardKey, ShardSelector, ShardSet};
use kube_shard_testserver::TestServer;
use serde_json::json;

use crate::{
    common::{cm, code, create_cms, enc, get_json, get_json_accept, item_names},
    crd::{install_widgets, widget, widget_resource},
};

fn half() -> ShardSelector {
    let s = ShardCount::new(256).unwrap();
    ShardSelector::for_shards(ShardKey::Uid, s, &ShardSet::parse("0-127", s).unwrap()).unwrap()
}

fn in_range(sel: &ShardSelector, objs: &[ConfigMap]) -> Vec<String> {
    let mut v: Vec<String> = objs
        .iter()
        .filter(|o| sel.matches(fnv1a64(o.metadata.uid.as_ref().unwrap().as_bytes())))
        .map(|o| o.metadata.name.clone().unwrap())
        .collect();
    v.sort();
    v
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";
const METADATA_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

#[tokio::test]
async fn gate_on_list_filters_and_echoes_shard_info() {
    let server = TestServer::builder().shard_selector(true).build();
    let client = server.client("a");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let objs = create_cms(&api, "cm", 40).await;
    let sel = half();
    let want = in_range(&sel, &objs);
    assert!(!want.is_empty() && want.len() < 40);
    let list = get_json(
        &client,
        &format!("{CMS}?shardSelector={}", enc(&sel.to_string())),
    )
    .await
    .unwrap();
    assert_eq!(item_names(&list), want);
    assert_eq!(list["metadata"]["shardInfo"]["selector"], sel.to_string());
    assert!(
        list["items"][0].get("kind").is_none(),
        "built-in list items carry no kind"
    );

    // Whitespace variants are echoed in canonical form.
    let spaced = sel.to_string().replace(", ", " ,  ");
    let list = get_json(&client, &format!("{CMS}?shardSelector={}", enc(&spaced)))
        .await
        .unwrap();
    assert_eq!(list["metadata"]["shardInfo"]["selector"], sel.to_string());

    // Metadata-only lists are filtered but carry no shardInfo.
    let meta = get_json_accept(
        &client,
        &format!("{CMS}?shardSelector={}", enc(&sel.to_string())),
        METADATA_LIST,
    )
    .await
    .unwrap();
    assert_eq!(meta["kind"], "PartialObjectMetadataList");
    assert_eq!(item_names(&meta), want);
    assert!(meta["metadata"].get("shardInfo").is_none());

    // Label selectors AND with it.
    api.create(
        &PostParams::default(),
        &crate::common::cm_labeled("lab", "a", "b"),
    )
    .await
    .unwrap();
    let list = get_json(
        &client,
        &format!(
            "{CMS}?labelSelector=a%3Db&shardSelector={}",
            enc(&sel.to_string())
        ),
    )
    .await
    .unwrap();
    let lab = api.get("lab").await.unwrap();
    let expect_lab = sel.matches(fnv1a64(lab.metadata.uid.unwrap().as_bytes()));
    assert_eq!(item_names(&list).len(), usize::from(expect_lab));

    // Pages: limit counts matching items; the selector is resent with every continue.
    let mut names = Vec::new();
    let mut cont = String::new();
    loop {
        let uri = format!(
            "{CMS}?limit=7&shardSelector={}{cont}",
            enc(&sel.to_string())
        );
        let page = get_json(&client, &uri).await.unwrap();
        assert!(page["items"].as_array().unwrap().len() <= 7);
        names.extend(item_names(&page));
        match page["metadata"]["continue"].as_str() {
            Some(c) => cont = format!("&continue={}", enc(c)),
            None => break,
        }
    }
    names.sort();
    let mut want_all = want.clone();
    if expect_lab {
        want_all.push("lab".into());
        want_all.sort();
    }
    assert_eq!(names, want_all);
}

#[tokio::test]
async fn gate_on_watch_and_watch_list_are_filtered() {
    let server = TestServer::builder().shard_selector(true).build();
    let client = server.client("a");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let before = create_cms(&api, "pre", 20).await;
    let sel = half();
    let rv = server.resource_version().to_string();
    let mut req = Request::new(CMS)
        .watch(&WatchParams::default().timeout(30), &rv)
        .unwrap();
    append(&mut req, &sel);
    let events = client.request_events::<ConfigMap>(req).await.unwrap();
    let after = create_cms(&api, "post", 20).await;
    let want = in_range(&sel, &after);
    let got: Vec<String> = events
        .take(want.len())
        .map_ok(|e| match e {
            WatchEvent::Added(o) => o.metadata.name.unwrap(),
            other => panic!("unexpected {other:?}"),
        })
        .try_collect()
        .await
        .unwrap();
    let mut got = got;
    got.sort();
    assert_eq!(got, want);

    // Watch-list: initial events filtered, then the initial-events-end bookmark.
    let mut req = Request::new(CMS)
        .watch(&WatchParams::default().initial_events().timeout(30), "")
        .unwrap();
    append(&mut req, &sel);
    let mut all = before.clone();
    all.extend(after);
    let want = in_range(&sel, &all);
    let mut events = client
        .request_events::<ConfigMap>(req)
        .await
        .unwrap()
        .boxed();
    let mut got = Vec::new();
    loop {
        match events.next().await.unwrap().unwrap() {
            WatchEvent::Added(o) => got.push(o.metadata.name.unwrap()),
            WatchEvent::Bookmark(b) => {
                assert_eq!(
                    b.metadata
                        .annotations
                        .get("k8s.io/initial-events-end")
                        .map(String::as_str),
                    Some("true")
                );
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    got.sort();
    assert_eq!(got, want);
}

fn append(req: &mut http::Request<Vec<u8>>, sel: &ShardSelector) {
    let uri = format!("{}&shardSelector={}", req.uri(), enc(&sel.to_string()));
    *req.uri_mut() = uri.parse().unwrap();
}

#[tokio::test]
async fn crd_lists_are_filtered_without_shard_info() {
    let server = TestServer::builder().shard_selector(true).build();
    install_widgets(&server, "Namespaced", false).await;
    let client = server.client("a");
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &widget_resource());
    let mut uids = Vec::new();
    for i in 0..30 {
        let w = api
            .create(&PostParams::default(), &widget(&format!("w{i}"), json!({})))
            .await
            .unwrap();
        uids.push((w.metadata.name.unwrap(), w.metadata.uid.unwrap()));
    }
    let sel = half();
    let mut want: Vec<String> = uids
        .iter()
        .filter(|(_, u)| sel.matches(fnv1a64(u.as_bytes())))
        .map(|(n, _)| n.clone())
        .collect();
    want.sort();
    let list = get_json(
        &client,
        &format!(
            "/apis/example.com/v1/namespaces/default/widgets?shardSelector={}",
            enc(&sel.to_string())
        ),
    )
    .await
    .unwrap();
    assert_eq!(item_names(&list), want);
    assert!(list["metadata"].get("shardInfo").is_none());
    assert_eq!(
        list["items"][0]["kind"], "Widget",
        "CRD list items carry their kind"
    );
}

#[tokio::test]
async fn invalid_selector_is_a_500_without_reason_when_the_gate_is_on() {
    let server = TestServer::builder().shard_selector(true).build();
    let client = server.client("a");
    for bad in [
        " ",
        "shardRange(object.metadata.uid, '0x0', '0x8000000000000000')",
        "shardRange(object.metadata.name, '0x0000000000000000', '0x8000000000000000')",
        "shardRange(object.metadata.uid, '0x8000000000000000', '0x0000000000000000')",
        "true && false",
        "shardRange(object.metadata.uid, \"0x0000000000000000\", \"0x8000000000000000\")",
    ] {
        let err = get_json(&client, &format!("{CMS}?shardSelector={}", enc(bad)))
            .await
            .unwrap_err();
        let kube::Error::Api(status) = err else {
            panic!("{err}")
        };
        assert_eq!(status.code, 500, "{bad}");
        assert_eq!(status.reason, "", "{bad}");
        assert!(
            status.message.starts_with("invalid shard selector: "),
            "{bad}: {}",
            status.message
        );
        // Watches too.
        let err = get_json(
            &client,
            &format!("{CMS}?watch=true&shardSelector={}", enc(bad)),
        )
        .await
        .unwrap_err();
        assert_eq!(code(&err), Some(500));
    }
    // The empty string means "no sharding"; the first value wins.
    assert!(get_json(&client, &format!("{CMS}?shardSelector="))
        .await
        .is_ok());
    let list = get_json(
        &client,
        &format!("{CMS}?shardSelector=&shardSelector=garbage"),
    )
    .await
    .unwrap();
    assert!(list["metadata"].get("shardInfo").is_none());
}

#[tokio::test]
async fn gate_off_ignores_the_parameter_entirely() {
    let server = TestServer::new();
    let client = server.client("a");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    create_cms(&api, "cm", 10).await;
    let list = get_json(
        &client,
        &format!("{CMS}?shardSelector={}", enc(&half().to_string())),
    )
    .await
    .unwrap();
    assert_eq!(item_names(&list).len(), 10);
    assert!(list["metadata"].get("shardInfo").is_none());
    let list = get_json(&client, &format!("{CMS}?shardSelector={}", enc("garbage")))
        .await
        .unwrap();
    assert_eq!(item_names(&list).len(), 10);
    // Switch at run time.
    server.set_shard_selector(true);
    let list = get_json(
        &client,
        &format!("{CMS}?shardSelector={}", enc(&half().to_string())),
    )
    .await
    .unwrap();
    assert!(list["metadata"]["shardInfo"]["selector"].is_string());
    assert_eq!(
        code(
            &get_json(&client, &format!("{CMS}?shardSelector=garbage"))
                .await
                .unwrap_err()
        ),
        Some(500)
    );
}

#[tokio::test]
async fn deletecollection_honours_the_selector() {
    let server = TestServer::builder().shard_selector(true).build();
    let client = server.client("a");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let objs = create_cms(&api, "cm", 30).await;
    let sel = half();
    let doomed = in_range(&sel, &objs);
    let req = http::Request::delete(format!("{CMS}?shardSelector={}", enc(&sel.to_string())))
        .body(Vec::new())
        .unwrap();
    let answer: serde_json::Value =
        serde_json::from_str(&client.request_text(req).await.unwrap()).unwrap();
    assert_eq!(item_names(&answer), doomed);
    let left: Vec<String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.metadata.name.unwrap())
        .collect();
    assert_eq!(left.len(), 30 - doomed.len());
    assert!(left.iter().all(|n| !doomed.contains(n)));
}

#[tokio::test]
async fn namespace_key_selects_whole_namespaces() {
    let server = TestServer::builder().shard_selector(true).build();
    let client = server.client("a");
    for ns in ["default", "kube-system"] {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        api.create(&PostParams::default(), &cm("x")).await.unwrap();
    }
    // `default` hashes to 0xebad..., `kube-system` to 0xdf65...: [0xe0.., 2^64) holds only default.
    let sel: ShardSelector =
        "shardRange(object.metadata.namespace, '0xe000000000000000', '0x10000000000000000')"
            .parse()
            .unwrap();
    let list = get_json(
        &client,
        &format!("/api/v1/configmaps?shardSelector={}", enc(&sel.to_string())),
    )
    .await
    .unwrap();
    let nss: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(nss, ["default"]);
}
