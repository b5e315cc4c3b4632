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
