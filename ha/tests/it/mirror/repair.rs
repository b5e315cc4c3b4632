//! Copies deleted or edited on the Standby come back: the reverse sweep of the prune pass queues every
//! source whose copy is missing or not the source's version.

use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

use super::{config, eventually, pair, start, widget, widget_in_step, widgets, APPS};

/// After the copies converge, one is deleted and one edited on the Standby by someone else, and the
/// sources never change again: within a prune period both are the source's again (without the sweep
/// they stay lost until the source changes, while the position says everything is applied).
#[tokio::test(start_paused = true)]
async fn a_copy_deleted_or_edited_on_the_standby_is_repaired() {
    let (a, b) = pair().await;
    let src = widgets(&a, APPS);
    for n in ["kept", "deleted", "edited"] {
        src.create(&PostParams::default(), &widget(n, 1))
            .await
            .unwrap();
    }
    let cfg = config().prune(Some(Duration::from_secs(60)), Duration::from_secs(30));
    let m = start(&a, &b, cfg).await;
    for n in ["kept", "deleted", "edited"] {
        eventually(30, n, || widget_in_step(&a, &b, n))
            .await
            .unwrap();
    }
    let copies = widgets(&b, APPS);
    copies
        .delete("deleted", &DeleteParams::default())
        .await
        .unwrap();
    copies
        .patch(
            "edited",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"v": 99}})),
        )
        .await
        .unwrap();
    assert!(!widget_in_step(&a, &b, "deleted").await);
    assert!(!widget_in_step(&a, &b, "edited").await);
    for n in ["deleted", "edited"] {
        eventually(90, n, || widget_in_step(&a, &b, n))
            .await
            .unwrap();
    }
    assert!(m.kind("widgets.example.kube-shard.io").unwrap().repairs >= 2);
    m.stop().await;
}
