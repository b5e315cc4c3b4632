//! `labelSelector` (equality- and set-based) and `fieldSelector` (`metadata.name`, `metadata.namespace`
//! and the per-resource field labels of the real server, such as `involvedObject.*` for events).

use serde_json::Value;

use crate::status::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
}

/// A parsed label selector: requirements ANDed.
#[derive(Debug, Clone, Default)]
pub(crate) struct LabelSelector {
    reqs: Vec<(String, Op)>,
}

impl LabelSelector {
    pub(crate) fn parse(text: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(text) {
            let part = part.trim();
            if part.is_empty() {
                if text.trim().is_empty() {
                    continue;
                }
                return Err(bad_label(text, "found '', expected: identifier"));
            }
            reqs.push(parse_req(part).map_err(|why| bad_label(text, &why))?);
        }
        Ok(LabelSelector { reqs })
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        self.reqs.iter().all(|(k, op)| {
            let v = labels.get(k).and_then(Value::as_str);
            match op {
                Op::Eq(x) => v == Some(x.as_str()),
                Op::NotEq(x) => v != Some(x.as_str()),
                Op::In(xs) => v.is_some_and(|v| xs.iter().any(|x| x == v)),
                Op::NotIn(xs) => v.is_none_or(|v| xs.iter().all(|x| x != v)),
                Op::Exists => v.is_some(),
                Op::DoesNotExist => v.is_none(),
            }
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// A `metav1.LabelSelector` object, converted as apimachinery's `LabelSelectorAsSelector` does:
    /// `matchLabels` as equalities and `matchExpressions` (`In`, `NotIn`, `Exists`, `DoesNotExist`), all
    /// ANDed; null or `{}` selects everything. `Err` says what is malformed (an unknown operator, an
    /// invalid key or value, `In`/`NotIn` without values, `Exists`/`DoesNotExist` with values, a wrong
    /// JSON type). The real server refuses such a selector when the object carrying it is written, so the
    /// wording is testserver's own.
    pub(crate) fn from_object(sel: &Value) -> Result<Self, String> {
        if !(sel.is_null() || sel.is_object()) {
            return Err(format!("label selector {sel} is not an object"));
        }
        let mut reqs = match_labels(&sel["matchLabels"])?;
        for e in json_list(&sel["matchExpressions"], "matchExpressions")? {
            reqs.push(match_expression(e)?);
        }
        Ok(LabelSelector { reqs })
    }
}

/// The items of a JSON list (null: none).
fn json_list<'a>(v: &'a Value, what: &str) -> Result<&'a [Value], String> {
    match v {
        Value::Null => Ok(&[]),
        Value::Array(a) => Ok(a),
        other => Err(format!("{what}: {other} is not a list")),
    }
}

fn match_labels(m: &Value) -> Result<Vec<(String, Op)>, String> {
    let map = match m {
        Value::Null => return Ok(Vec::new()),
        Value::Object(map) => map,
        other => return Err(format!("matchLabels: {other} is not a map")),
    };
    map.iter()
        .map(|(k, v)| -> Result<(String, Op), String> {
            let v = v
                .as_str()
                .ok_or_else(|| format!("matchLabels[{k}]: {v} is not a string"))?;
            checked_requirement(k, std::iter::once(v))?;
            Ok((k.clone(), Op::Eq(v.to_owned())))
        })
        .collect()
}

fn match_expression(e: &Value) -> Result<(String, Op), String> {
    let key = e["key"]
        .as_str()
        .ok_or_else(|| format!("matchExpressions: {e} has no string key"))?;
    let values = json_list(&e["values"], "values")?
        .iter()
        .map(|v| v.as_str().map(str::to_owned))
        .collect::<Option<Vec<String>>>()
        .ok_or_else(|| format!("values of {key:?}: not all strings"))?;
    let op = e["operator"].as_str().unwrap_or_default();
    let set = match op {
        "In" | "NotIn" => true,
        "Exists" | "DoesNotExist" => false,
        _ => return Err(format!("{op:?} is not a valid label selector operator")),
    };
    checked_requirement(key, values.iter().map(String::as_str))?;
    if set == values.is_empty() {
        return Err(if set {
            format!("values of {key:?}: for 'in', 'notin' operators, values set can't be empty")
        } else {
            format!("values of {key:?}: values set must be empty for exists and does not exist")
        });
    }
    Ok((
        key.to_owned(),
        match op {
            "In" => Op::In(values),
            "NotIn" => Op::NotIn(values),
            "Exists" => Op::Exists,
            _ => Op::DoesNotExist,
        },
    ))
}

/// apimachinery's `NewRequirement` checks of a key and its values.
fn checked_requirement<'a>(
    key: &str,
    mut values: impl Iterator<Item = &'a str>,
) -> Result<(), String> {
    if !valid_key(key) {
        return Err(format!("invalid label key {key:?}"));
    }
    match values.find(|v| !valid_value(v)) {
        Some(v) => Err(format!("invalid label value {v:?} for key {key:?}")),
        None => Ok(()),
    }
}

fn bad_label(text: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!(
        "unable to parse requirement: {why} (labelSelector {text:?})"
    ))
}

/// Split on commas outside parentheses.
fn split_top(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

pub(crate) fn valid_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b))
    });
    name_ok && prefix_ok
}

pub(crate) fn valid_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && v.as_bytes()[0].is_ascii_alphanumeric()
            && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric())
}

fn parse_req(part: &str) -> Result<(String, Op), String> {
    let key_ok = |k: &str| -> Result<String, String> {
        if valid_key(k) {
            Ok(k.to_string())
        } else {
            Err(format!("invalid label key {k:?}"))
        }
    };
    let val_ok = |v: &str| -> Result<String, String> {
        let v = v.trim();
        if valid_value(v) {
            Ok(v.to_string())
        } else {
            Err(format!("invalid label value: {v:?}"))
        }
    };
    if let Some(k) = part.strip_prefix('!') {
        return Ok((key_ok(k.trim())?, Op::DoesNotExist));
    }
    for (tok, neg) in [(" notin ", true), (" in ", false)] {
        if let Some(idx) = part.find(tok) {
            let key = key_ok(part[..idx].trim())?;
            let set = part[idx + tok.len()..].trim();
            let inner = set
                .strip_prefix('(')
                .and_then(|s| s.strip_suffix(')'))
                .ok_or_else(|| format!("found {set:?}, expected: '('"))?;
            let vals = inner
                .split(',')
                .map(val_ok)
                .collect::<Result<Vec<_>, _>>()?;
            return Ok((key, if neg { Op::NotIn(vals) } else { Op::In(vals) }));
        }
    }
    if let Some((k, v)) = part.split_once("!=") {
        return Ok((key_ok(k.trim())?, Op::NotEq(val_ok(v)?)));
    }
    if let Some((k, v)) = part.split_once("==") {
        return Ok((key_ok(k.trim())?, Op::Eq(val_ok(v)?)));
    }
    if let Some((k, v)) = part.split_once('=') {
        return Ok((key_ok(k.trim())?, Op::Eq(val_ok(v)?)));
    }
    if part.contains(['<', '>', '(', ')', ' ']) {
        return Err(format!(
            "found {part:?}, expected: in, notin, =, ==, !=, gt, lt"
        ));
    }
    Ok((key_ok(part)?, Op::Exists))
}

/// A parsed field selector: `field=value`, `field==value`, `field!=value`, ANDed.
#[derive(Debug, Clone, Default)]
pub(crate) struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

/// The fields every resource supports.
const META_FIELDS: [&str; 2] = ["metadata.name", "metadata.namespace"];

/// The fields beyond `metadata.name`/`metadata.namespace` the real server's field label conversions
/// accept, per (group, plural).
fn extra_fields(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("", "secrets") => &["type"],
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "namespaces") => &["status.phase"],
        ("", "replicationcontrollers") | ("apps", "replicasets") => &["status.replicas"],
        ("", "services") => &["spec.clusterIP", "spec.type"],
        ("batch", "jobs") => &["status.successful"],
        ("certificates.k8s.io", "certificatesigningrequests") => &["spec.signerName"],
        _ => &[],
    }
}

impl FieldSelector {
    pub(crate) fn parse(text: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (field, eq, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{text}'; can't understand '{part}'"
                )));
            };
            reqs.push((field.trim().to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector { reqs })
    }

    /// Refuse fields the resource has no field label for, as the real server does (400).
    pub(crate) fn check_supported(&self, group: &str, plural: &str) -> Result<(), ApiError> {
        let extra = extra_fields(group, plural);
        for (f, _, _) in &self.reqs {
            if !META_FIELDS.contains(&f.as_str()) && !extra.contains(&f.as_str()) {
                // Kinds without field label conversions answer as the generic registry does.
                return Err(ApiError::bad_request(if extra.is_empty() {
                    format!("{f:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\"")
                } else {
                    format!("field label not supported: {f}")
                }));
            }
        }
        Ok(())
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.reqs
            .iter()
            .all(|(f, eq, want)| (field_value(obj, f) == *want) == *eq)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// The name an equality requirement fixes (`metadata.name=NAME`), if any.
    pub(crate) fn name(&self) -> Option<&str> {
        self.equal("metadata.name")
    }

    /// The namespace an equality requirement fixes (`metadata.namespace=NS`), if any.
    pub(crate) fn namespace(&self) -> Option<&str> {
        self.equal("metadata.namespace")
    }

    fn equal(&self, field: &str) -> Option<&str> {
        self.reqs
            .iter()
            .find(|(f, eq, _)| *eq && f == field)
            .map(|(_, _, v)| v.as_str())
    }
}

/// A field's value as the server's field set renders it: strings as they are, numbers and booleans
/// as text, missing as "". An event's `source` is `source.component`.
fn field_value(obj: &Value, field: &str) -> String {
    let path = if field == "source" {
        "source.component"
    } else {
        field
    };
    let mut v = obj;
    for seg in path.split('.') {
        match v.get(seg) {
            Some(next) => v = next,
            None => return String::new(),
        }
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let o = json!({"metadata": {"labels": {"app": "a", "tier": "web"}}});
        for (sel, want) in [
            ("app=a", true),
            ("app==a", true),
            ("app!=a", false),
            ("app in (a, b)", true),
            ("app notin (a,b)", false),
            ("tier,app=a", true),
            ("!tier", false),
            ("missing", false),
            ("!missing", true),
            ("missing notin (x)", true),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
        for bad in ["app=(", "a b", "app in a", "=x", "app=a,,"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_selector_objects() {
        let o = json!({"metadata": {"labels": {"app": "a", "tier": "web"}}});
        let bare = json!({"metadata": {}});
        for (sel, on_o, on_bare) in [
            (json!(null), true, true),
            (json!({}), true, true),
            (
                json!({"matchLabels": {}, "matchExpressions": []}),
                true,
                true,
            ),
            (json!({"matchLabels": {"app": "a"}}), true, false),
            (json!({"matchLabels": {"app": "b"}}), false, false),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["x", "a"]}]}),
                true,
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}]}),
                false,
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}),
                true,
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist", "values": []}]}),
                false,
                true,
            ),
            (
                json!({"matchLabels": {"app": "a"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["web"]}]}),
                false,
                false,
            ),
        ] {
            let parsed = LabelSelector::from_object(&sel).unwrap();
            assert_eq!(
                (parsed.matches(&o), parsed.matches(&bare)),
                (on_o, on_bare),
                "{sel}"
            );
        }
        for bad in [
            json!("app=a"),
            json!({"matchLabels": {"app": 1}}),
            json!({"matchLabels": {"bad key": "a"}}),
            json!({"matchLabels": {"app": "a,b"}}),
            json!({"matchExpressions": [{"key": "app", "operator": "Foo", "values": ["a"]}]}),
            json!({"matchExpressions": [{"key": "app", "operator": "In", "values": []}]}),
            json!({"matchExpressions": [{"key": "app", "operator": "In"}]}),
            json!({"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["a"]}]}),
            json!({"matchExpressions": [{"operator": "Exists"}]}),
            json!({"matchExpressions": {"key": "app"}}),
        ] {
            assert!(LabelSelector::from_object(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn field_selectors() {
        let o = json!({"metadata": {"name": "x", "namespace": "ns"}});
        assert!(FieldSelector::parse("metadata.name=x").unwrap().matches(&o));
        assert!(!FieldSelector::parse("metadata.name!=x")
            .unwrap()
            .matches(&o));
        assert!(
            FieldSelector::parse("metadata.namespace==ns,metadata.name=x")
                .unwrap()
                .matches(&o)
        );
        let unsupported = FieldSelector::parse("spec.x=1").unwrap();
        assert!(unsupported.check_supported("", "configmaps").is_err());
        let ev = json!({"involvedObject": {"kind": "Pod", "name": "p"}, "source": {"component": "kubelet"}});
        let sel =
            FieldSelector::parse("involvedObject.kind=Pod,involvedObject.name=p,source=kubelet")
                .unwrap();
        assert!(sel.check_supported("", "events").is_ok());
        assert!(sel.matches(&ev));
        assert!(sel.check_supported("", "configmaps").is_err());
        assert!(!FieldSelector::parse("involvedObject.name=q")
            .unwrap()
            .matches(&ev));
    }
}
