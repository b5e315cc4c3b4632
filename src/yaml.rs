//! A minimal YAML writer for JSON values (block style; every string double-quoted, which is JSON's own
//! escaping and valid YAML). Enough for printing generated manifests without a YAML dependency.

use serde_json::Value;

/// Append `doc` (an object) as one YAML document.
pub(crate) fn write_document(doc: &Value, out: &mut String) {
    match doc {
        Value::Object(_) | Value::Array(_) => write_block(doc, 0, out),
        other => {
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Object(m) if m.is_empty() => "{}".to_owned(),
        Value::Array(a) if a.is_empty() => "[]".to_owned(),
        Value::String(s) if plain(s) => s.clone(),
        // other strings come out JSON-quoted; numbers, booleans and null are the same in YAML
        other => other.to_string(),
    }
}

/// A string YAML reads back as the same string without quotes: a letter, then letters, digits and `./_-`, and
/// none of the words YAML 1.1 reads as booleans or null.
fn plain(s: &str) -> bool {
    const WORDS: [&str; 11] = [
        "y", "n", "yes", "no", "true", "false", "on", "off", "null", "nan", "inf",
    ];
    s.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'/' | b'_' | b'-'))
        && !WORDS.contains(&s.to_ascii_lowercase().as_str())
}

fn is_block(v: &Value) -> bool {
    matches!(v, Value::Object(m) if !m.is_empty()) || matches!(v, Value::Array(a) if !a.is_empty())
}

fn write_block(v: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(m) => {
            for (k, val) in m {
                let key = if plain(k) {
                    k.clone()
                } else {
                    Value::String(k.clone()).to_string()
                };
                if is_block(val) {
                    out.push_str(&format!("{pad}{key}:\n"));
                    let child = if val.is_array() { indent } else { indent + 2 };
                    write_block(val, child, out);
                } else {
                    out.push_str(&format!("{pad}{key}: {}\n", scalar(val)));
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                if is_block(item) {
                    // the first line of the item goes after "- ", the rest at indent + 2
                    let mut inner = String::new();
                    write_block(item, indent + 2, &mut inner);
                    let inner = inner.trim_start_matches(' ');
                    out.push_str(&format!("{pad}- {inner}"));
                } else {
                    out.push_str(&format!("{pad}- {}\n", scalar(item)));
                }
            }
        }
        other => out.push_str(&format!("{pad}{}\n", scalar(other))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn nested_maps_and_lists() {
        let mut out = String::new();
        super::write_document(
            &json!({"a": {"b": ["x", {"c": 1, "d": [true]}], "e": {}}, "k/x": "it's \"q\"", "o": ["on", "*", "v1"]}),
            &mut out,
        );
        assert_eq!(
            out,
            "a:\n  b:\n  - x\n  - c: 1\n    d:\n    - true\n  e: {}\nk/x: \"it's \\\"q\\\"\"\no:\n- \"on\"\n- \"*\"\n- v1\n"
        );
    }
}
