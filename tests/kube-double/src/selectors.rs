//! Label selectors (string form and `LabelSelector` objects) and field selectors.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::kinds::KindInfo;
use crate::status::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Equals(String),
    NotEquals(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
}

/// A parsed label selector: all requirements must hold. `nothing` matches no object (a null
/// `LabelSelector` in a PodDisruptionBudget).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector {
    reqs: Vec<Requirement>,
    nothing: bool,
}

impl LabelSelector {
    pub fn nothing() -> Self {
        LabelSelector {
            reqs: Vec::new(),
            nothing: true,
        }
    }

    /// Parses the `labelSelector` query syntax: `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for term in split_top_level(s) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            reqs.push(parse_requirement(term).map_err(|why| {
                ApiError::bad_request(format!(
                    "unable to parse requirement: {why}: invalid label selector \"{s}\""
                ))
            })?);
        }
        Ok(LabelSelector {
            reqs,
            nothing: false,
        })
    }

    /// Converts a `meta/v1 LabelSelector` object; `null` selects nothing, `{}` everything.
    pub fn from_object(sel: Option<&Value>) -> Result<Self, String> {
        let Some(sel) = sel.filter(|v| !v.is_null()) else {
            return Ok(LabelSelector::nothing());
        };
        let mut reqs = Vec::new();
        if let Some(Value::Object(m)) = sel.get("matchLabels") {
            for (k, v) in m {
                let v = v.as_str().ok_or("matchLabels values must be strings")?;
                reqs.push(Requirement {
                    key: k.clone(),
                    op: Op::Equals(v.to_string()),
                });
            }
        }
        if let Some(Value::Array(exprs)) = sel.get("matchExpressions") {
            for e in exprs {
                let key = e
                    .get("key")
                    .and_then(Value::as_str)
                    .ok_or("matchExpressions[].key is required")?
                    .to_string();
                let values: BTreeSet<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                let op = match e.get("operator").and_then(Value::as_str) {
                    Some("In") if !values.is_empty() => Op::In(values),
                    Some("NotIn") if !values.is_empty() => Op::NotIn(values),
                    Some("Exists") if values.is_empty() => Op::Exists,
                    Some("DoesNotExist") if values.is_empty() => Op::DoesNotExist,
                    other => return Err(format!("invalid matchExpressions operator {other:?}")),
                };
                reqs.push(Requirement { key, op });
            }
        }
        Ok(LabelSelector {
            reqs,
            nothing: false,
        })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        if self.nothing {
            return false;
        }
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| match &r.op {
            Op::Equals(v) => get(&r.key) == Some(v.as_str()),
            Op::NotEquals(v) => get(&r.key) != Some(v.as_str()),
            Op::In(set) => get(&r.key).is_some_and(|v| set.contains(v)),
            Op::NotIn(set) => get(&r.key).is_none_or(|v| !set.contains(v)),
            Op::Exists => get(&r.key).is_some(),
            Op::DoesNotExist => get(&r.key).is_none(),
        })
    }

    pub fn is_everything(&self) -> bool {
        !self.nothing && self.reqs.is_empty()
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(v: &str) -> bool {
    v.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_set(rest: &str) -> Result<BTreeSet<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or("expected a parenthesised set of values")?;
    let mut set = BTreeSet::new();
    for v in inner.split(',') {
        let v = v.trim();
        if !valid_value(v) {
            return Err(format!("invalid label value: \"{v}\""));
        }
        set.insert(v.to_string());
    }
    Ok(set)
}

fn parse_requirement(term: &str) -> Result<Requirement, String> {
    if let Some(key) = term.strip_prefix('!') {
        let key = key.trim();
        if !valid_key(key) {
            return Err(format!("invalid label key \"{key}\""));
        }
        return Ok(Requirement {
            key: key.to_string(),
            op: Op::DoesNotExist,
        });
    }
    for (sep, kind) in [("!=", 0), ("==", 1), ("=", 1)] {
        if let Some((k, v)) = term.split_once(sep) {
            let (k, v) = (k.trim(), v.trim());
            if !valid_key(k) {
                return Err(format!("invalid label key \"{k}\""));
            }
            if !valid_value(v) {
                return Err(format!("invalid label value: \"{v}\""));
            }
            let op = if kind == 0 {
                Op::NotEquals(v.to_string())
            } else {
                Op::Equals(v.to_string())
            };
            return Ok(Requirement {
                key: k.to_string(),
                op,
            });
        }
    }
    let mut words = term.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or("").trim();
    let rest = words.next().unwrap_or("").trim();
    if !valid_key(key) {
        return Err(format!("invalid label key \"{key}\""));
    }
    if rest.is_empty() {
        return Ok(Requirement {
            key: key.to_string(),
            op: Op::Exists,
        });
    }
    if let Some(r) = rest.strip_prefix("notin") {
        return Ok(Requirement {
            key: key.to_string(),
            op: Op::NotIn(parse_set(r)?),
        });
    }
    if let Some(r) = rest.strip_prefix("in") {
        return Ok(Requirement {
            key: key.to_string(),
            op: Op::In(parse_set(r)?),
        });
    }
    Err(format!(
        "found '{rest}', expected: in, notin, =, ==, !=, or end of string"
    ))
}

/// A parsed field selector: `a=b,c!=d` (`==` is `=`), restricted to the fields the resource
/// type supports.
#[derive(Debug, Clone, Default)]
pub(crate) struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

impl FieldSelector {
    pub fn parse(s: &str, kind: &KindInfo) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for term in split_unescaped_commas(s) {
            if term.trim().is_empty() {
                continue;
            }
            let (field, eq, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            if field != "metadata.name"
                && field != "metadata.namespace"
                && !kind.fields.contains(&field)
            {
                let mut known = vec!["\"metadata.name\"", "\"metadata.namespace\""];
                let extra: Vec<String> = kind.fields.iter().map(|f| format!("\"{f}\"")).collect();
                known.extend(extra.iter().map(String::as_str));
                return Err(ApiError::bad_request(format!(
                    "\"{field}\" is not a known field selector: only {}",
                    known.join(", ")
                )));
            }
            terms.push((field.to_string(), eq, unescape(value.trim())));
        }
        Ok(FieldSelector { terms })
    }

    pub fn add_name(&mut self, name: &str) {
        self.terms
            .push(("metadata.name".into(), true, name.to_string()));
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.terms
            .iter()
            .all(|(f, eq, v)| (field_value(obj, f) == *v) == *eq)
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }
}

fn split_unescaped_commas(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push('\\');
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            out.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else {
            out.push(c);
        }
    }
    out
}

/// The string value a field selector compares, as the apiserver's field label functions
/// produce it (booleans as `true`/`false`, missing strings as "").
fn field_value(obj: &Value, field: &str) -> String {
    // events.k8s.io names (regarding, reportingController) and core names (involvedObject,
    // reportingComponent) select the same data.
    let candidates: Vec<String> = if let Some(rest) = field
        .strip_prefix("involvedObject.")
        .or_else(|| field.strip_prefix("regarding."))
    {
        vec![
            format!("involvedObject.{rest}"),
            format!("regarding.{rest}"),
        ]
    } else if field == "reportingComponent" || field == "reportingController" {
        vec!["reportingComponent".into(), "reportingController".into()]
    } else if field == "source" {
        vec![
            "source.component".into(),
            "deprecatedSource.component".into(),
        ]
    } else {
        vec![field.to_string()]
    };
    for c in candidates {
        let ptr = format!("/{}", c.replace('.', "/"));
        match obj.pointer(&ptr) {
            Some(Value::String(s)) => return s.clone(),
            Some(Value::Bool(b)) => return b.to_string(),
            Some(Value::Number(n)) => return n.to_string(),
            _ => {}
        }
    }
    if matches!(field, "spec.unschedulable" | "spec.hostNetwork") {
        "false".into()
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_syntax() {
        let o = json!({"metadata": {"labels": {"app": "web", "tier": "gpu"}}});
        for (s, want) in [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web,db)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("missing!=x", true),
            ("app=web,tier in (cpu)", false),
            ("", true),
        ] {
            assert_eq!(LabelSelector::parse(s).unwrap().matches(&o), want, "{s}");
        }
        assert!(LabelSelector::parse("a b c").is_err());
    }

    #[test]
    fn null_selector_matches_nothing_and_empty_everything() {
        let o = json!({"metadata": {"labels": {"app": "web"}}});
        assert!(!LabelSelector::from_object(None).unwrap().matches(&o));
        assert!(LabelSelector::from_object(Some(&json!({})))
            .unwrap()
            .matches(&o));
    }
}
