//! Label selectors as `kubectl -l` writes them (pure): parsed into kube's [`Selector`], printed back in the
//! same syntax (the checkpoint records it so), and converted into a `metav1.LabelSelector` for an
//! admission binding.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::core::{Expression, Selector};

use super::error::MirrorError;

/// The longest selector text accepted.
const MAX_SELECTOR: usize = 4096;

/// Parse a label selector as `kubectl -l` takes it: requirements separated by commas, each `key`,
/// `!key`, `key=value`, `key==value`, `key!=value`, `key in (v1,v2)` or `key notin (v1,v2)`.
pub fn parse_labels(text: &str) -> Result<Selector, MirrorError> {
    let bad = |why: String| MirrorError::Input(format!("the label selector {text:?}: {why}"));
    if text.len() > MAX_SELECTOR {
        return Err(bad(format!("longer than {MAX_SELECTOR} bytes")));
    }
    let mut exprs = Vec::new();
    for part in split_top(text).map_err(&bad)? {
        exprs.push(requirement(part.trim()).map_err(&bad)?);
    }
    Ok(exprs.into_iter().collect())
}

/// Split at the commas outside parentheses.
fn split_top(text: &str) -> Result<Vec<&str>, String> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err("unbalanced or nested parentheses".into());
        }
    }
    if depth != 0 {
        return Err("an unclosed parenthesis".into());
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn requirement(part: &str) -> Result<Expression, String> {
    if part.is_empty() {
        return Err("an empty requirement".into());
    }
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(key_of(key.trim())?));
    }
    for (op, neg) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((k, v)) = part.split_once(op) {
            let (k, v) = (key_of(k.trim())?, value_of(v.trim())?);
            return Ok(if neg {
                Expression::NotEqual(k, v)
            } else {
                Expression::Equal(k, v)
            });
        }
    }
    let mut words = part.splitn(2, char::is_whitespace);
    let key = key_of(words.next().unwrap_or_default())?;
    let Some(rest) = words.next().map(str::trim) else {
        return Ok(Expression::Exists(key));
    };
    let (neg, set) = if let Some(s) = rest.strip_prefix("notin") {
        (true, s)
    } else if let Some(s) = rest.strip_prefix("in") {
        (false, s)
    } else {
        return Err(format!("{part:?}: expected =, ==, !=, in or notin"));
    };
    let inner = set
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("{part:?}: the values are not in parentheses"))?;
    let values = inner
        .split(',')
        .map(|v| value_of(v.trim()))
        .collect::<Result<_, _>>()?;
    Ok(if neg {
        Expression::NotIn(key, values)
    } else {
        Expression::In(key, values)
    })
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
fn key_of(k: &str) -> Result<String, String> {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    });
    if !prefix_ok || name.is_empty() || !is_label_text(name) {
        return Err(format!("{k:?} is not a label key"));
    }
    Ok(k.to_string())
}

/// A label value: empty, or at most 63 alphanumerics, `-`, `_`, `.`, beginning and ending alphanumeric.
fn value_of(v: &str) -> Result<String, String> {
    if v.is_empty() || is_label_text(v) {
        Ok(v.to_string())
    } else {
        Err(format!("{v:?} is not a label value"))
    }
}

fn is_label_text(s: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.len() <= 63
        && edge(s.chars().next())
        && edge(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The selector as a `metav1.LabelSelector` (for an admission binding's `objectSelector`).
#[must_use]
pub fn label_selector(s: &Selector) -> LabelSelector {
    let req = |key: String, operator: &str, values: Option<Vec<String>>| LabelSelectorRequirement {
        key,
        operator: operator.to_string(),
        values,
    };
    let exprs = s
        .clone()
        .into_iter()
        .map(|e| match e {
            Expression::In(k, v) => req(k, "In", Some(v.into_iter().collect())),
            Expression::NotIn(k, v) => req(k, "NotIn", Some(v.into_iter().collect())),
            Expression::Equal(k, v) => req(k, "In", Some(vec![v])),
            Expression::NotEqual(k, v) => req(k, "NotIn", Some(vec![v])),
            Expression::Exists(k) => req(k, "Exists", None),
            Expression::DoesNotExist(k) => req(k, "DoesNotExist", None),
        })
        .collect();
    LabelSelector {
        match_expressions: Some(exprs),
        match_labels: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::SelectorExt;
    use std::collections::BTreeMap;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_label_selector_parses_as_kubectl_takes_it_and_prints_back_the_same() {
        let s = parse_labels("app=shop, tier in (web,api),!legacy,env!=dev,team").unwrap();
        assert!(s.matches(&labels(&[("app", "shop"), ("tier", "api"), ("team", "a")])));
        assert!(!s.matches(&labels(&[("app", "shop"), ("tier", "db"), ("team", "a")])));
        assert!(!s.matches(&labels(&[
            ("app", "shop"),
            ("tier", "web"),
            ("team", "a"),
            ("legacy", "")
        ])));
        let again = parse_labels(&s.to_string()).unwrap();
        assert_eq!(again, s);
        assert!(parse_labels("").unwrap().selects_all());
        assert!(parse_labels("example.com/part-of==x").is_ok());
    }

    #[test]
    fn a_malformed_label_selector_is_an_error_naming_it() {
        for bad in [
            "a=b,",
            "a in (b",
            "a in b",
            "a)b(",
            "a ~ b",
            "-a=b",
            "a=b c",
            "a in ((b))",
            "Upper.Case/x=y",
        ] {
            let e = parse_labels(bad).expect_err(bad).to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
        assert!(parse_labels(&"a".repeat(MAX_SELECTOR + 1)).is_err());
    }

    #[test]
    fn the_binding_form_of_a_selector_keeps_every_requirement() {
        let s = parse_labels("a=b,c!=d,e in (f,g),h notin (i),j,!k").unwrap();
        let ls = label_selector(&s);
        let back: Selector = ls.try_into().unwrap();
        for l in [
            labels(&[("a", "b"), ("e", "f"), ("j", "")]),
            labels(&[("a", "b"), ("c", "d"), ("e", "f"), ("j", "")]),
            labels(&[("a", "b"), ("e", "g"), ("h", "i"), ("j", "")]),
            labels(&[("a", "b"), ("e", "g"), ("j", ""), ("k", "")]),
        ] {
            assert_eq!(back.matches(&l), s.matches(&l), "{l:?}");
        }
    }
}
