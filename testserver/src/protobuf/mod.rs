//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`), as kubectl sends built-in kinds on its
//! imperative commands: the Kubernetes envelope (magic `k8s\0`, then a `runtime.Unknown` with the type and
//! the object's message), decoded into the JSON the same object would have been sent as, which then takes
//! the JSON path (so it is stored exactly as a JSON body would be).
//!
//! Field numbers, JSON names and kinds come from a table generated from the k8s-pb crate
//! (`testserver/protobuf/`); a field number the table does not know is refused with 415 naming it, never
//! dropped. Zero plain scalars are left out as Go's JSON encoding leaves them out, except in required and
//! pointer fields. Custom resources and CRDs are refused with 415 (kube-apiserver v1.36.2 panics on a
//! custom resource's protobuf body and never answers).

mod forms;
mod table;
mod wire;

use base64::Engine;
use serde_json::{Map, Value};

use crate::status::{ApiError, ApiResult};
use forms::{go_duration, summarize, time};
use table::{Field, Kind, Shape};
use wire::{Reader, Value as Wire};

pub(crate) use table::table;

/// The media type.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
const MAGIC: &[u8] = b"k8s\0";
/// Nesting deeper than this is refused (Kubernetes objects nest a few levels; this bounds the stack).
const MAX_DEPTH: usize = 48;

/// The JSON of a protobuf body sent to a `group/version` resource of `kind`. Errors are kube-apiserver's:
/// 400 for bytes that are not a message of this kind (its wording), 415 for a message this server cannot
/// decode without losing something.
pub(crate) fn body_to_json(
    group: &str,
    version: &str,
    kind: &str,
    body: &[u8],
) -> ApiResult<Vec<u8>> {
    let unrecognized = |detail: &str| {
        ApiError::new(
            400,
            Some("BadRequest"),
            format!(
                "the object provided is unrecognized (must be of type {kind}): {detail} ({})",
                summarize(body)
            ),
        )
    };
    if body.is_empty() {
        return Err(unrecognized("empty data"));
    }
    let Some(inner) = body.strip_prefix(MAGIC) else {
        return Err(unrecognized(
            "provided data does not appear to be a protobuf message, expected prefix [107 56 115 0]",
        ));
    };
    if inner.is_empty() {
        return Err(unrecognized("empty body"));
    }
    let t = table();
    let env = envelope(t, inner).map_err(|e| {
        if e.code == 400 {
            unrecognized(&detail(&e))
        } else {
            e
        }
    })?;
    let api_version = group_version(group, version);
    // an envelope without a type is the endpoint's kind (kube-apiserver decodes into it)
    let sent_version = env
        .type_meta
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or(&api_version);
    let sent_kind = env
        .type_meta
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or(kind);
    let v = sent_version.rsplit('/').next().unwrap_or_default();
    let cannot = |detail: &str| {
        ApiError::new(
            400,
            Some("BadRequest"),
            format!("{sent_kind} in version {v:?} cannot be handled as a {kind}: {detail}"),
        )
    };
    if sent_version != api_version || sent_kind != kind {
        let internal = if group.is_empty() {
            "core"
        } else {
            group.split('.').next().unwrap_or(group)
        };
        return Err(cannot(&format!(
            "converting ({v}.{sent_kind}) to ({internal}.{kind}): unknown conversion"
        )));
    }
    if !env.encoding.is_empty() {
        return Err(unsupported(format!(
            "content encoding {:?} is not supported",
            env.encoding
        )));
    }
    let Some(msg) = t.kinds.get(&format!("{group}/{version}/{kind}")) else {
        return Err(unsupported(format!(
            "{api_version} {kind} has no protobuf message in this server's table ({}): send it as \
             application/json",
            t.source
        )));
    };
    let mut obj = decode(t, msg, env.raw, 0).map_err(|e| {
        if e.code == 400 {
            cannot(&detail(&e))
        } else {
            e
        }
    })?;
    obj.insert("apiVersion".into(), Value::String(api_version));
    obj.insert("kind".into(), Value::String(kind.to_owned()));
    Ok(serde_json::to_vec(&Value::Object(obj)).unwrap_or_default())
}

/// The envelope (`runtime.Unknown`): the type, the object's message, its encoding.
struct Envelope<'a> {
    /// `apiVersion` and `kind`, as far as sent (empty ones left out).
    type_meta: Map<String, Value>,
    raw: &'a [u8],
    encoding: String,
}

fn envelope<'a>(t: &table::Table, buf: &'a [u8]) -> ApiResult<Envelope<'a>> {
    const UNKNOWN: &str = "io.k8s.apimachinery.pkg.runtime.Unknown";
    let mut env = Envelope {
        type_meta: Map::new(),
        raw: &[],
        encoding: String::new(),
    };
    let mut r = Reader::new(buf);
    while let Some((n, v)) = r.next_field().map_err(bad)? {
        match (n, v) {
            (1, Wire::Bytes(b)) => {
                env.type_meta = decode(t, "io.k8s.apimachinery.pkg.runtime.TypeMeta", b, 1)?;
            }
            (2, Wire::Bytes(b)) => env.raw = b,
            (3, Wire::Bytes(b)) => env.encoding = String::from_utf8_lossy(b).into_owned(),
            (4, Wire::Bytes(_)) => {} // the content type: protobuf, as the header says
            (1..=4, _) => return Err(bad(format!("{UNKNOWN}: field {n} has the wrong wire type"))),
            _ => return Err(unknown_field(t, n, UNKNOWN)),
        }
    }
    Ok(env)
}

fn unknown_field(t: &table::Table, number: u32, name: &str) -> ApiError {
    unsupported(format!(
        "field number {number} of {name} is not known to this server's protobuf table ({}): the \
         body was not stored; send it as application/json",
        t.source
    ))
}

/// The decoder's own words in a 400 (without the prefix `bad` adds).
fn detail(e: &ApiError) -> String {
    e.message.strip_prefix(BAD).unwrap_or(&e.message).to_owned()
}

fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    }
}

const BAD: &str = "the body of the request could not be decoded as protobuf: ";

fn bad(detail: String) -> ApiError {
    ApiError::new(400, Some("BadRequest"), format!("{BAD}{detail}"))
}

fn unsupported(detail: String) -> ApiError {
    ApiError::new(415, Some("UnsupportedMediaType"), detail)
}

/// Decode message `name` into its JSON object.
fn decode(t: &table::Table, name: &str, buf: &[u8], depth: usize) -> ApiResult<Map<String, Value>> {
    if depth > MAX_DEPTH {
        return Err(bad(format!("messages nested deeper than {MAX_DEPTH}")));
    }
    let Some(msg) = t.messages.get(name) else {
        return Err(unsupported(format!(
            "message {name} is not in this server's table ({})",
            t.source
        )));
    };
    let mut obj = Map::new();
    let mut r = Reader::new(buf);
    while let Some((number, value)) = r.next_field().map_err(bad)? {
        let Some(f) = msg.fields.get(&number) else {
            return Err(unknown_field(t, number, name));
        };
        match f.shape {
            Shape::One => {
                match (&f.kind, scalar_or_message(t, name, f, value, depth)?) {
                    (Kind::Inline(_), Value::Object(inner)) => obj.extend(inner),
                    (kind, v) if !f.required && omitted(kind, &v) => {
                        obj.remove(&f.json); // the last occurrence wins, as in Go
                    }
                    (_, v) => {
                        obj.insert(f.json.clone(), v);
                    }
                }
            }
            Shape::Repeated => {
                let items = repeated(t, name, f, value, depth)?;
                let list = obj
                    .entry(f.json.clone())
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(a) = list {
                    a.extend(items);
                }
            }
            Shape::Map => {
                let (k, v) = map_entry(t, name, f, value, depth)?;
                let m = obj
                    .entry(f.json.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(m) = m {
                    m.insert(k, v);
                }
            }
        }
    }
    Ok(obj)
}

/// Go's JSON encoding leaves out a zero plain scalar (`omitempty`; the encoder always writes those) and a
/// zero `Time` (`omitzero`). Pointer and required fields are marked `required` in the table and kept. A
/// message's JSON (`IntOrString` 0, a `Quantity`, `{}`) is a Go struct: never left out.
fn omitted(kind: &Kind, v: &Value) -> bool {
    match (kind, v) {
        (Kind::Message(_), Value::Null) => true,
        (Kind::Message(_) | Kind::Inline(_), _) => false,
        (_, Value::String(s)) => s.is_empty(),
        (_, Value::Bool(b)) => !b,
        (_, Value::Number(n)) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

fn wrong_wire(name: &str, f: &Field) -> ApiError {
    bad(format!(
        "{name}.{}: the value's wire type does not fit its kind",
        f.json
    ))
}

fn scalar_or_message(
    t: &table::Table,
    name: &str,
    f: &Field,
    v: Wire<'_>,
    depth: usize,
) -> ApiResult<Value> {
    Ok(match (&f.kind, v) {
        (Kind::Str, Wire::Bytes(b)) => Value::String(
            std::str::from_utf8(b)
                .map_err(|_| bad(format!("{name}.{}: not UTF-8", f.json)))?
                .to_owned(),
        ),
        (Kind::Bytes, Wire::Bytes(b)) => {
            Value::String(base64::engine::general_purpose::STANDARD.encode(b))
        }
        (Kind::I32, Wire::Varint(n)) => Value::from(n as i64 as i32),
        (Kind::I64, Wire::Varint(n)) => Value::from(n as i64),
        (Kind::Bool, Wire::Varint(n)) => Value::Bool(n != 0),
        (Kind::Double, Wire::Fixed64(n)) => serde_json::Number::from_f64(f64::from_bits(n))
            .map(Value::Number)
            .ok_or_else(|| bad(format!("{name}.{}: not a finite number", f.json)))?,
        (Kind::Message(m) | Kind::Inline(m), Wire::Bytes(b)) => message_value(t, m, b, depth + 1)?,
        _ => return Err(wrong_wire(name, f)),
    })
}

fn repeated(
    t: &table::Table,
    name: &str,
    f: &Field,
    v: Wire<'_>,
    depth: usize,
) -> ApiResult<Vec<Value>> {
    match (&f.kind, v) {
        // packed numbers (Kubernetes writes them unpacked; both are valid protobuf)
        (Kind::I32 | Kind::I64 | Kind::Bool, Wire::Bytes(b)) => {
            let nums = wire::packed_varints(b).map_err(bad)?;
            nums.into_iter()
                .map(|n| scalar_or_message(t, name, f, Wire::Varint(n), depth))
                .collect()
        }
        (_, v) => Ok(vec![scalar_or_message(t, name, f, v, depth)?]),
    }
}

fn map_entry(
    t: &table::Table,
    name: &str,
    f: &Field,
    v: Wire<'_>,
    depth: usize,
) -> ApiResult<(String, Value)> {
    let Wire::Bytes(entry) = v else {
        return Err(wrong_wire(name, f));
    };
    let (mut key, mut value) = (String::new(), None);
    let mut r = Reader::new(entry);
    while let Some((n, v)) = r.next_field().map_err(bad)? {
        match (n, v) {
            (1, Wire::Bytes(b)) => {
                key = std::str::from_utf8(b)
                    .map_err(|_| bad(format!("{name}.{}: a key is not UTF-8", f.json)))?
                    .to_owned();
            }
            (2, v) => value = Some(scalar_or_message(t, name, f, v, depth)?),
            (n, _) => {
                return Err(unsupported(format!(
                    "field number {n} of a {name}.{} entry is not known to this server's protobuf table",
                    f.json
                )))
            }
        }
    }
    let value = match value {
        Some(v) => v,
        None => match &f.kind {
            Kind::Message(m) => message_value(t, m, &[], depth + 1)?,
            Kind::Bytes | Kind::Str => Value::String(String::new()),
            _ => Value::from(0),
        },
    };
    Ok((key, value))
}

/// A nested message's JSON, with the apimachinery types that have a JSON form of their own.
fn message_value(t: &table::Table, name: &str, b: &[u8], depth: usize) -> ApiResult<Value> {
    const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.";
    let raw = || -> ApiResult<Map<String, Value>> { decode(t, name, b, depth) };
    Ok(match name.strip_prefix(META).unwrap_or(name) {
        "Time" => time(&raw()?, false),
        "MicroTime" => time(&raw()?, true),
        "Duration" => Value::String(go_duration(
            raw()?.get("duration").and_then(Value::as_i64).unwrap_or(0),
        )),
        "FieldsV1" | "io.k8s.apimachinery.pkg.runtime.RawExtension" => {
            embedded_json(one_bytes_field(t, name, b)?)?
        }
        "io.k8s.apimachinery.pkg.api.resource.Quantity" => raw()?
            .remove("string")
            .unwrap_or_else(|| Value::String(String::new())),
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString" => int_or_string(t, name, b)?,
        _ if t.messages.get(name).is_some_and(|m| m.array) => raw()?
            .into_values()
            .next()
            .unwrap_or_else(|| Value::Array(Vec::new())),
        _ if name.starts_with("io.k8s.apiextensions-apiserver.") => {
            return Err(unsupported(format!(
                "{name} (a JSON schema) is not decoded from protobuf by this server: send the \
                 CustomResourceDefinition as application/json"
            )))
        }
        _ => Value::Object(raw()?),
    })
}

/// `IntOrString` (type 1: 0 int, 1 string; intVal 2; strVal 3): a number or a string, zero included.
fn int_or_string(t: &table::Table, name: &str, b: &[u8]) -> ApiResult<Value> {
    let (mut is_str, mut int, mut text) = (false, 0, String::new());
    let mut r = Reader::new(b);
    while let Some((n, v)) = r.next_field().map_err(bad)? {
        match (n, v) {
            (1, Wire::Varint(ty)) => is_str = ty != 0,
            (2, Wire::Varint(i)) => int = i as i64 as i32,
            (3, Wire::Bytes(s)) => text = String::from_utf8_lossy(s).into_owned(),
            (1..=3, _) => return Err(bad(format!("{name}: field {n} has the wrong wire type"))),
            _ => return Err(unknown_field(t, n, name)),
        }
    }
    Ok(if is_str {
        Value::String(text)
    } else {
        Value::from(int)
    })
}

/// The bytes of a message whose one field is `bytes raw = 1` (`FieldsV1`, `RawExtension`).
fn one_bytes_field<'a>(t: &table::Table, name: &str, b: &'a [u8]) -> ApiResult<&'a [u8]> {
    let mut raw: &[u8] = &[];
    let mut r = Reader::new(b);
    while let Some((n, v)) = r.next_field().map_err(bad)? {
        match (n, v) {
            (1, Wire::Bytes(bytes)) => raw = bytes,
            (1, _) => return Err(bad(format!("{name}: field 1 has the wrong wire type"))),
            _ => return Err(unknown_field(t, n, name)),
        }
    }
    Ok(raw)
}

fn embedded_json(raw: &[u8]) -> ApiResult<Value> {
    if raw.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(raw).map_err(|_| {
        unsupported("an embedded object that is not JSON (a nested protobuf object) is not decoded by this server".into())
    })
}

#[cfg(test)]
mod tests;
