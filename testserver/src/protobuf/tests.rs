use serde_json::json;

use super::*;

/// A field for the test encoder.
enum E<'a> {
    V(u64),
    S(&'a str),
    B(&'a [u8]),
    M(Vec<(u32, E<'a>)>),
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn enc(fields: &[(u32, E<'_>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (n, e) in fields {
        match e {
            E::V(v) => {
                varint(u64::from(*n) << 3, &mut out);
                varint(*v, &mut out);
            }
            E::S(s) => len_delimited(*n, s.as_bytes(), &mut out),
            E::B(b) => len_delimited(*n, b, &mut out),
            E::M(m) => len_delimited(*n, &enc(m), &mut out),
        }
    }
    out
}

fn len_delimited(n: u32, b: &[u8], out: &mut Vec<u8>) {
    varint((u64::from(n) << 3) | 2, out);
    varint(b.len() as u64, out);
    out.extend_from_slice(b);
}

/// The envelope around `raw`.
fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend(enc(&[
        (1, E::M(vec![(1, E::S(api_version)), (2, E::S(kind))])),
        (2, E::B(raw)),
    ]));
    out
}

fn entry<'a>(k: &'a str, v: E<'a>) -> E<'a> {
    E::M(vec![(1, E::S(k)), (2, v)])
}

fn decoded(group: &str, version: &str, kind: &str, body: &[u8]) -> Value {
    serde_json::from_slice(&body_to_json(group, version, kind, body).expect("decodes")).unwrap()
}

/// What kubectl's typed client writes for `create namespace tt`: Go's non-pointer fields are always on the
/// wire, empty or not; the JSON has only what `omitempty` keeps.
#[test]
fn a_namespace_as_kubectl_sends_it_is_the_json_it_would_have_sent() {
    let meta = vec![
        (1, E::S("tt")),
        (2, E::S("")),
        (3, E::S("")),
        (7, E::V(0)),
        (8, E::M(vec![])),
        (11, entry("team", E::S("a"))),
    ];
    let raw = enc(&[(1, E::M(meta)), (2, E::M(vec![])), (3, E::M(vec![]))]);
    assert_eq!(
        decoded("", "v1", "Namespace", &envelope("v1", "Namespace", &raw)),
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "tt", "labels": {"team": "a"}},
               "spec": {}, "status": {}})
    );
}

#[test]
fn a_deployment_keeps_its_special_types() {
    let container = vec![
        (1, E::S("web")),
        (2, E::S("nginx")),
        // resources.limits {cpu: 500m}
        (
            8,
            E::M(vec![(1, entry("cpu", E::M(vec![(1, E::S("500m"))])))]),
        ),
        // a port, and a probe (an embedded handler: inlined) on a named port
        (6, E::M(vec![(3, E::V(80)), (4, E::S("TCP"))])),
        (
            10,
            E::M(vec![
                (
                    1,
                    E::M(vec![(
                        2,
                        E::M(vec![
                            (1, E::S("/")),
                            (2, E::M(vec![(1, E::V(1)), (3, E::S("http"))])),
                        ]),
                    )]),
                ),
                (2, E::V(0)),
                // plain int32s: Go writes them always, zero or not
                (3, E::V(0)),
                (4, E::V(0)),
                (5, E::V(0)),
                (6, E::V(0)),
            ]),
        ),
    ];
    let spec = vec![
        (1, E::V(3)),
        (2, E::M(vec![(1, entry("app", E::S("web")))])),
        (3, E::M(vec![(2, E::M(vec![(2, E::M(container))]))])),
        (4, E::M(vec![])),
        (5, E::V(0)),
    ];
    let meta = vec![(1, E::S("web")), (8, E::M(vec![(1, E::V(1_767_225_600))]))];
    let raw = enc(&[(1, E::M(meta)), (2, E::M(spec))]);
    let d = decoded(
        "apps",
        "v1",
        "Deployment",
        &envelope("apps/v1", "Deployment", &raw),
    );
    assert_eq!(d["metadata"]["creationTimestamp"], "2026-01-01T00:00:00Z");
    assert_eq!(d["spec"]["replicas"], 3);
    let zero = enc(&[
        (1, E::M(vec![(1, E::S("z"))])),
        (2, E::M(vec![(1, E::V(0)), (5, E::V(0))])),
    ]);
    let z = decoded(
        "apps",
        "v1",
        "Deployment",
        &envelope("apps/v1", "Deployment", &zero),
    );
    assert_eq!(
        z["spec"],
        json!({"replicas": 0}),
        "a pointer's zero stays, a value's goes"
    );
    assert!(d["spec"].get("minReadySeconds").is_none(), "omitempty");
    assert_eq!(d["spec"]["strategy"], json!({}));
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["resources"]["limits"]["cpu"], "500m");
    assert_eq!(
        c["ports"][0],
        json!({"containerPort": 80, "protocol": "TCP"})
    );
    assert_eq!(
        c["livenessProbe"],
        json!({"httpGet": {"path": "/", "port": "http"}}),
        "zero plain scalars left out"
    );
}

#[test]
fn secret_bytes_are_base64_and_required_zeros_stay() {
    let raw = enc(&[
        (1, E::M(vec![(1, E::S("s"))])),
        (2, entry("k", E::B(b"\x00hi"))),
    ]);
    let d = decoded("", "v1", "Secret", &envelope("v1", "Secret", &raw));
    assert_eq!(d["data"]["k"], "AGhp");
    let port = enc(&[
        (1, E::M(vec![(1, E::S("svc"))])),
        (2, E::M(vec![(1, E::M(vec![(3, E::V(0))]))])),
    ]);
    let d = decoded("", "v1", "Service", &envelope("v1", "Service", &port));
    assert_eq!(d["spec"]["ports"][0]["port"], 0, "required: kept");
}

#[test]
fn an_int_or_string_zero_stays_and_an_envelope_without_a_type_is_the_endpoints_kind() {
    // `kubectl create pdb p --selector=app=x --min-available=0`
    let spec = vec![(1, E::M(vec![(1, E::V(0)), (2, E::V(0))]))];
    let raw = enc(&[(1, E::M(vec![(1, E::S("p"))])), (2, E::M(spec))]);
    let d = decoded(
        "policy",
        "v1",
        "PodDisruptionBudget",
        &envelope("policy/v1", "PodDisruptionBudget", &raw),
    );
    assert_eq!(d["spec"]["minAvailable"], 0);
    let mut untyped = MAGIC.to_vec();
    untyped.extend(enc(&[
        (1, E::M(vec![])),
        (2, E::B(&enc(&[(1, E::M(vec![(1, E::S("c"))]))]))),
    ]));
    let d = decoded("", "v1", "ConfigMap", &untyped);
    assert_eq!(
        (d["kind"].as_str(), d["metadata"]["name"].as_str()),
        (Some("ConfigMap"), Some("c"))
    );
}

#[test]
fn embedded_json_keeps_its_form_and_its_unknown_fields_are_refused() {
    let entry = vec![
        (1, E::S("kubectl")),
        (7, E::M(vec![(1, E::B(br#"{"f:data":{}}"#))])),
    ];
    let raw = enc(&[(1, E::M(vec![(1, E::S("c")), (17, E::M(entry))]))]);
    let d = decoded("", "v1", "ConfigMap", &envelope("v1", "ConfigMap", &raw));
    assert_eq!(
        d["metadata"]["managedFields"][0],
        json!({"manager": "kubectl", "fieldsV1": {"f:data": {}}})
    );
    let bad = enc(&[(
        1,
        E::M(vec![(17, E::M(vec![(7, E::M(vec![(2, E::V(1))]))]))]),
    )]);
    let e = body_to_json("", "v1", "ConfigMap", &envelope("v1", "ConfigMap", &bad)).unwrap_err();
    assert_eq!(e.code, 415, "an unknown field of FieldsV1: {}", e.message);
}

#[test]
fn an_unknown_field_number_is_refused_by_name_never_dropped() {
    let raw = enc(&[(1, E::M(vec![(1, E::S("c"))])), (99, E::S("new"))]);
    let e = body_to_json("", "v1", "ConfigMap", &envelope("v1", "ConfigMap", &raw)).unwrap_err();
    assert_eq!(e.code, 415);
    assert!(
        e.message
            .contains("field number 99 of io.k8s.api.core.v1.ConfigMap"),
        "{}",
        e.message
    );
}

#[test]
fn bad_bodies_get_a_clear_error() {
    // kube-apiserver v1.36.2's answers, word for word
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"hello".to_vec(), "the object provided is unrecognized (must be of type ConfigMap): provided data does not appear to be a protobuf message, expected prefix [107 56 115 0] (68656c6c6f)"),
        (MAGIC.to_vec(), "the object provided is unrecognized (must be of type ConfigMap): empty body (6b387300)"),
        (Vec::new(), "the object provided is unrecognized (must be of type ConfigMap): empty data (<empty>)"),
        (envelope("v1", "ConfigMap", &[1; 20])[..10].to_vec(), "the object provided is unrecognized (must be of type ConfigMap): unexpected EOF (6b3873000a0f0a027631)"),
        (envelope("v1", "Namespace", &[]), "Namespace in version \"v1\" cannot be handled as a ConfigMap: converting (v1.Namespace) to (core.ConfigMap): unknown conversion"),
        (br#"{"apiVersion":"v1","kind":"ConfigMap"}"#.to_vec(), "the object provided is unrecognized (must be of type ConfigMap): provided data does not appear to be a protobuf message, expected prefix [107 56 115 0] ({\"apiVersion\":\"v1\",\"kind\":\"Con ...)"),
    ];
    for (body, message) in &cases {
        let e = body_to_json("", "v1", "ConfigMap", body).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (400, *message));
    }
    let cr = body_to_json(
        "example.com",
        "v1",
        "Widget",
        &envelope("example.com/v1", "Widget", &[]),
    );
    assert_eq!(cr.unwrap_err().code, 415);
    // a CRD (its schema is JSON in JSON messages) is refused, not half decoded
    let crd = body_to_json(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        &envelope("apiextensions.k8s.io/v1", "CustomResourceDefinition", &[]),
    );
    assert_eq!(crd.unwrap_err().code, 415);
    // nesting is bounded: the only message that nests without end is a JSON schema (`not`), refused
    // above; the bound stands anyway
    let mut deep = enc(&[(1, E::S("x"))]);
    for _ in 0..200 {
        deep = enc(&[(28, E::B(&deep))]);
    }
    let props = "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSONSchemaProps";
    assert_eq!(decode(table(), props, &deep, 0).unwrap_err().code, 415);
    let e = decode(table(), "io.k8s.api.core.v1.ConfigMap", &[], MAX_DEPTH + 1).unwrap_err();
    assert!(e.message.contains("nested deeper than 48"), "{}", e.message);
}

#[test]
fn durations_print_as_go_prints_them() {
    for (ns, s) in [
        (0, "0s"),
        (1_500_000_000, "1.5s"),
        (3_600_000_000_000, "1h0m0s"),
        (90_000_000_000, "1m30s"),
        (150_000_000, "150ms"),
        (-2_000, "-2µs"),
    ] {
        assert_eq!(go_duration(ns), s);
    }
}

/// `KUBE_SHARD_FUZZ_SEEDS=1 cargo test -p kube-shard-testserver --lib write_fuzz_seeds -- --ignored`
/// (re)writes the protobuf fuzz target's seeds (`fuzz/corpus/protobuf_body/`): a kind byte
/// (`fuzzing::PROTOBUF_KINDS`), then a body as kubectl's typed client lays it out.
#[test]
#[ignore = "writes the fuzz corpus when asked to"]
fn write_fuzz_seeds() {
    if std::env::var_os("KUBE_SHARD_FUZZ_SEEDS").is_none() {
        return;
    }
    let meta = |n| {
        E::M(vec![
            (1, E::S(n)),
            (2, E::S("")),
            (7, E::V(0)),
            (8, E::M(vec![])),
            (11, entry("a", E::S("b"))),
        ])
    };
    let ns = enc(&[(1, meta("tt")), (2, E::M(vec![])), (3, E::M(vec![]))]);
    let secret = enc(&[
        (1, meta("s")),
        (2, entry("k", E::B(b"v"))),
        (3, E::S("Opaque")),
    ]);
    let container = E::M(vec![
        (1, E::S("web")),
        (2, E::S("nginx")),
        (
            8,
            E::M(vec![(1, entry("cpu", E::M(vec![(1, E::S("500m"))])))]),
        ),
        (6, E::M(vec![(3, E::V(80)), (4, E::S("TCP"))])),
    ]);
    let deploy = enc(&[
        (1, meta("web")),
        (
            2,
            E::M(vec![
                (1, E::V(2)),
                (2, E::M(vec![(1, entry("app", E::S("web")))])),
                (
                    3,
                    E::M(vec![(1, meta("")), (2, E::M(vec![(2, container)]))]),
                ),
                (4, E::M(vec![])),
            ]),
        ),
        (3, E::M(vec![])),
    ]);
    let svc = enc(&[
        (1, meta("svc")),
        (
            2,
            E::M(vec![(
                1,
                E::M(vec![
                    (3, E::V(80)),
                    (4, E::M(vec![(1, E::V(1)), (3, E::S("http"))])),
                ]),
            )]),
        ),
    ]);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/protobuf_body");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, kind, api, k, raw) in [
        ("namespace", 0u8, "v1", "Namespace", ns),
        ("secret", 2, "v1", "Secret", secret),
        ("deployment", 3, "apps/v1", "Deployment", deploy),
        ("service", 4, "v1", "Service", svc),
    ] {
        let mut body = vec![kind];
        body.extend(envelope(api, k, &raw));
        assert!(
            crate::fuzzing::decode_protobuf_body(&body).is_ok(),
            "{name}"
        );
        std::fs::write(dir.join(format!("seed-{name}")), body).unwrap();
    }
}
