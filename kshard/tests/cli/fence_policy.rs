//! `kshard fence-policy`: the library's policy and binding as YAML; bad input exits 2 with the reason.

use std::process::Command;

#[test]
fn prints_policy_and_binding_yaml() {
    let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args([
            "fence-policy",
            "--resource",
            "widgets.example.com",
            "--resource",
            "configmaps",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let yaml = String::from_utf8(out.stdout).unwrap();
    let set = kube_shard::fence_policy::FencePolicyConfig::new(vec![
        "widgets.example.com".parse().unwrap(),
        "configmaps".parse().unwrap(),
    ])
    .generate()
    .unwrap();
    assert_eq!(yaml, set.to_yaml());
    assert!(yaml.contains("kind: ValidatingAdmissionPolicyBinding"));
    assert!(yaml.contains("      - widgets/status\n"), "{yaml}");
}

#[test]
fn bad_resource_or_annotation_exits_2() {
    for args in [
        &["fence-policy", "--resource", "Widgets.x"][..],
        &["fence-policy", "--resource", "w.x", "--annotation", "a'b"][..],
        &[
            "fence-policy",
            "--resource",
            "w.x",
            "--params",
            "no-namespace",
        ][..],
        &["fence-policy", "--resource", "w.x", "--params", "ns/Bad"][..],
        &[
            "fence-policy",
            "--resource",
            "w.x",
            "--status-fence-field",
            ".spec.fence",
        ][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("invalid"),
            "{args:?}"
        );
    }
}

#[test]
fn params_add_the_per_shard_policy_and_the_empty_configmap() {
    let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args([
            "fence-policy",
            "--resource",
            "widgets.example.com",
            "--params",
            "ops/widgets-fence",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let yaml = String::from_utf8(out.stdout).unwrap();
    let set = kube_shard::fence_policy::FencePolicyConfig::new(vec!["widgets.example.com"
        .parse()
        .unwrap()])
    .params("ops/widgets-fence".parse().unwrap())
    .generate()
    .unwrap();
    assert_eq!(yaml, set.to_yaml());
    assert!(yaml.contains("name: kube-shard-fence-shard\n"), "{yaml}");
    assert!(yaml.contains("kind: ConfigMap\n"), "{yaml}");
    assert_eq!(
        yaml.matches("kind: ValidatingAdmissionPolicyBinding")
            .count(),
        2
    );
}

#[test]
fn status_fence_field_adds_the_status_policies() {
    let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args([
            "fence-policy",
            "--resource",
            "widgets.example.com",
            "--params",
            "ops/widgets-fence",
            "--status-fence-field",
            ".status.kubeShardFence",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let yaml = String::from_utf8(out.stdout).unwrap();
    let set = kube_shard::fence_policy::FencePolicyConfig::new(vec!["widgets.example.com"
        .parse()
        .unwrap()])
    .params("ops/widgets-fence".parse().unwrap())
    .status_field(".status.kubeShardFence".parse().unwrap())
    .generate()
    .unwrap();
    assert_eq!(yaml, set.to_yaml());
    assert!(
        yaml.contains("name: kube-shard-fence-status-shard\n"),
        "{yaml}"
    );
    assert_eq!(
        yaml.matches("kind: ValidatingAdmissionPolicyBinding")
            .count(),
        4
    );
}

#[test]
fn min_epoch_params_add_the_min_epoch_policy_and_its_configmap() {
    let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args([
            "fence-policy",
            "--resource",
            "widgets.example.com",
            "--min-epoch-params",
            "ops/widgets-ha-min-epoch",
            "--operator-identity",
            "system:serviceaccount:ops:widgets",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).unwrap();
    let set = kube_shard::fence_policy::FencePolicyConfig::new(vec!["widgets.example.com"
        .parse()
        .unwrap()])
    .min_epoch(kube_shard::fence_policy::MinEpoch::new(
        "ops/widgets-ha-min-epoch".parse().unwrap(),
        vec!["system:serviceaccount:ops:widgets".into()],
    ))
    .generate()
    .unwrap();
    assert_eq!(yaml, set.to_yaml());
    assert!(
        yaml.contains("  name: kube-shard-fence-min-epoch\n"),
        "{yaml}"
    );
    assert!(
        yaml.contains("  minFailoverEpoch: \"0\"\n  role: active\n"),
        "{yaml}"
    );
    // one without the other, or a quote in the identity, is bad input
    for args in [
        &[
            "fence-policy",
            "--resource",
            "w.x",
            "--min-epoch-params",
            "ops/m",
        ][..],
        &[
            "fence-policy",
            "--resource",
            "w.x",
            "--operator-identity",
            "u",
        ][..],
        &[
            "fence-policy",
            "--resource",
            "w.x",
            "--min-epoch-params",
            "ops/m",
            "--operator-identity",
            "a'b",
        ][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}
